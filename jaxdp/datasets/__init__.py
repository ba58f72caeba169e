"""The TFDS builders jaxdp ships, a module each, named as the dataset ("digits": `jaxdp.datasets.digits`), and the
builders of a user's own data (`npz`, `image_folder`). `jaxdp.data` imports one by module path when its dataset is
opened; importing this package imports none of them."""
