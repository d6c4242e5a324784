"""Figures from the T-CNN paper (d'Ascoli et al. 2021, arXiv:2106.05795), printed beside our measurements.
They are the paper's, not ours.

Table 2: parameters (million), throughput (images/s on a V100 at batch 32) and GFLOPs of each ResNet-RS at its
training resolution and of its T-CNN at the fine-tuning resolution. The ResNet-RS "Flops" are in the convention of
``torch.utils.flop_counter`` (2 per multiply-add): it gives 12.02 G for resnetrs101 at 192 px and 31.06 G for
resnetrs152 at 256 px, where the table says 12.1 and 31.2. (The table's ResNet50 row, 4.1 at 224, quoted from
another paper, counts multiply-adds instead; we do not use it.) Table 1: total training
time (TTT) normalised to ResNet50-RS, for the original training and after fine-tuning without and with
self-attention; the fine-tuning epochs being the same, their time ratio is a throughput ratio of SA to no-SA.
The paper has no such figures for ResNet-D (Table 5 has accuracies only).
"""
from typing import Any, Dict, Optional

__all__ = ['TABLE2', 'TABLE1_TTT', 'paper_figures']

SOURCE = 'T-CNN (arXiv:2106.05795), Tables 1-2; V100, batch 32; the paper\'s figures, not measured here'

# timm name -> (CNN row, T-CNN row) of Table 2.
TABLE2 = {
    'resnetrs50': ({'res': 160, 'params_m': 36, 'img_s': 938, 'gflops': 4.6},
                   {'res': 224, 'params_m': 38, 'img_s': 447, 'gflops': 17.6}),
    'resnetrs101': ({'res': 192, 'params_m': 64, 'img_s': 674, 'gflops': 12.1},
                    {'res': 224, 'params_m': 66, 'img_s': 334, 'gflops': 25.1}),
    'resnetrs152': ({'res': 256, 'params_m': 87, 'img_s': 304, 'gflops': 31.2},
                    {'res': 320, 'params_m': 89, 'img_s': 128, 'gflops': 65.8}),
    'resnetrs200': ({'res': 256, 'params_m': 93, 'img_s': 225, 'gflops': 40.4},
                    {'res': 320, 'params_m': 96, 'img_s': 105, 'gflops': 80.2}),
    'resnetrs270': ({'res': 256, 'params_m': 130, 'img_s': 152, 'gflops': 54.2},
                    {'res': 320, 'params_m': 133, 'img_s': 75, 'gflops': 107.2}),
    'resnetrs350': ({'res': 288, 'params_m': 164, 'img_s': 89, 'gflops': 87.5},
                    {'res': 320, 'params_m': 167, 'img_s': 61, 'gflops': 130.5}),
}

# timm name -> (TTT of the original training, after fine-tuning without SA, after fine-tuning with SA), Table 1.
TABLE1_TTT = {
    'resnetrs50': (1.0, 1.16, 1.30),
    'resnetrs101': (1.39, 1.65, 1.79),
    'resnetrs152': (3.08, 3.75, 4.13),
    'resnetrs200': (4.15, 5.04, 5.42),
    'resnetrs270': (6.19, 7.49, 7.98),
    'resnetrs350': (10.49, 12.17, 12.69),
}


def paper_figures(model: str) -> Optional[Dict[str, Any]]:
    """The paper's figures for a timm model name, with the ratios derived from them; ``None`` if it has none.

    ``gflops_ratio_same_res`` and ``img_s_ratio_same_res`` scale the CNN's figures to the T-CNN's resolution by
    pixel count (exact for convolutions, an approximation only): T-CNN / CNN at equal resolution.
    ``finetune_speed_ratio`` is (fine-tuning time without SA) / (with SA) from Table 1.
    """
    name = model.split('.')[0]
    if name not in TABLE2:
        return None
    cnn, t_cnn = TABLE2[name]
    pixels = (t_cnn['res'] / cnn['res']) ** 2
    base, no_sa, sa = TABLE1_TTT[name]
    return {
        'source': SOURCE,
        'cnn': dict(cnn),
        'tcnn': dict(t_cnn),
        'gflops_ratio_same_res': t_cnn['gflops'] / (cnn['gflops'] * pixels),
        'img_s_ratio_same_res': t_cnn['img_s'] / (cnn['img_s'] / pixels),
        'finetune_speed_ratio': (no_sa - base) / (sa - base),
    }
