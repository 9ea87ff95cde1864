"""The paper's studies beyond the alpha sweep: variants, their runner and report."""
