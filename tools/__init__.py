"""Project tools: the notebook normalizer and the pytest plugin that measures notebooks' memory."""
