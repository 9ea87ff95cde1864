"""PPO for GARNet: GAE, the clipped loss, the jitted update, rollouts and the training loop."""
