"""The shared todo list: a wireview component over a list each process keeps in memory."""
