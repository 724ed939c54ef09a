"""Pure numpy/pyarrow kernels behind the dedup transforms. They never import Beam."""
