"""The agentic routing MDP: workflow trees, masks, transitions, prompts and episodes."""
