"""gp_jax: GraphPlanner and Graph Counselor in JAX."""
import pathlib

import setuptools

here = pathlib.Path(__file__).parent
requirements = [l.strip() for l in (here / "requirements.txt").read_text().splitlines()
                if l.strip() and not l.startswith("#")]

setuptools.setup(
    name="gp_jax",
    version="0.1.0",
    description="GraphPlanner (graph-memory agentic LLM routing) and Graph Counselor (multi-agent GraphRAG) in JAX",
    packages=setuptools.find_packages(include=["gp_jax", "gp_jax.*"]),
    python_requires=">=3.10",
    install_requires=requirements,
)
