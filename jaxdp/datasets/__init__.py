"""The datasets jaxdp ships, a module each named as the dataset, imported by `jaxdp.data` when one is opened."""
