"""Model families (ResNets, He et al. 2016; VGG, Simonyan & Zisserman 2015; Transformers,
Vaswani et al. 2017). Importing this package registers every model."""
from . import resnet, transformer, vgg  # noqa: F401  (registration side effects)
