"""The small CNN of ``tcnn demo``, registered with timm as ``demo_resnet10`` (no ``t_`` prefix: it is a CNN; its
T-CNN is made by ``tcnn.reparameterize``). ``import tcnn`` registers it with the ``t_*`` models
(``tcnn._registration``), so ``tcnn train --model demo_resnet10`` and ``tcnn.load`` of the demo's files find it.
"""
from timm.models import register_model
from timm.models.resnet import BasicBlock, ResNet

from ..errors import TcnnError

__all__ = ['DEMO_MODEL', 'demo_resnet10']

DEMO_MODEL = 'demo_resnet10'


@register_model
def demo_resnet10(pretrained: bool = False, **kwargs) -> ResNet:
    """The small CNN of ``tcnn demo`` (no pretrained weights: the demo trains it from scratch).

    timm's ``ResNet`` with one ``BasicBlock`` per stage, widths 16-32-64-128 (1/4 of ResNet-18's) and output stride
    16: ``layer4`` keeps ``layer3``'s resolution and dilates its 3x3 convs by 2 (timm's ``output_stride``), so at the
    demo's 96 px the last stage sees a 6x6 token grid (stride 32 would leave 3x3, too few for attention to show
    anything). Every argument of ``ResNet`` can be overridden (e.g. ``channels=(32, 64, 128, 256)``); ``tcnn.load``
    rebuilds such a model from the recorded arguments.
    """
    if pretrained:
        raise TcnnError(f'{DEMO_MODEL} has no pretrained weights: tcnn demo trains it from scratch (pass '
                        'pretrained=False, or --weights PATH / --no-pretrained to tcnn train)')
    args = dict(block=BasicBlock, layers=(1, 1, 1, 1), channels=(16, 32, 64, 128), stem_width=16, output_stride=16,
                num_classes=2)
    args.update(kwargs)
    args.pop('pretrained_cfg', None)
    args.pop('pretrained_cfg_overlay', None)
    args.pop('cache_dir', None)
    model = ResNet(**args)
    # what timm's resolve_data_config and tcnn.files.tcnn_file read: the demo's images are 96 px, evaluated whole (no
    # crop)
    model.pretrained_cfg = model.default_cfg = {
        'architecture': DEMO_MODEL, 'input_size': (3, 96, 96), 'crop_pct': 1.0, 'interpolation': 'bicubic',
        'mean': (0.485, 0.456, 0.406), 'std': (0.229, 0.224, 0.225), 'num_classes': model.num_classes,
        'first_conv': 'conv1', 'classifier': 'fc', 'pool_size': (6, 6)}
    return model
