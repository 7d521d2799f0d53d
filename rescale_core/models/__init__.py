"""Model families. Importing this package registers every model."""
from . import resnet, transformer, vgg  # noqa: F401  (registration side effects)
