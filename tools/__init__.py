"""Project tools: the notebook normalizer, the report writer, the pytest plugin that measures
notebooks' memory, and the import graph the layout tests read."""
