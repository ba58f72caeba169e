"""The command-line tools behind `python -m jaxdp.<tool>`: each imports the library and the loop,
never the other way round."""
