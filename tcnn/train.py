"""Fine-tune a T-CNN (seed 001 section 3) or its no-SA baseline: ``tcnn train``, ``python -m tcnn.train`` and
``torchrun --nproc_per_node=N -m tcnn.train`` take the same arguments.

A run: resolve the recipe (``tcnn.recipe``), set up torch.distributed from the torchrun environment (NCCL on GPU,
gloo on CPU), build the ImageFolder datasets with timm transforms, create the CNN (``tcnn.hub.create_cnn``),
reparameterise it (``tcnn.reparameterize``, verified in the exact configuration) unless ``no_sa``, or later for
``reparam_epoch``, then train epoch by epoch (``tcnn.engine``). Only rank 0 writes ``OUTPUT/config.yaml``,
``OUTPUT/metrics.jsonl`` (one JSON object per epoch) and the checkpoints ``OUTPUT/last.pt`` / ``OUTPUT/best.pt``
(atomic, ``torch.load(weights_only=True)``-loadable; ``tcnn.load`` reads the model out of them).
"""
import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from .atomic import atomic_copy, atomic_torch_save, atomic_write_text
from .convert import find_convertible_convs, gpsa_layers, gpsa_summary, reparameterize_
from .engine import NonFiniteLossError, evaluate, train_one_epoch
from .errors import TcnnError
from .hub import create_cnn
from .optim import add_gpsa_groups, apply_group_settings, create_optimizer, create_scheduler
from .recipe import RECIPE_KEYS, apply_overrides, default_recipe, dump_recipe, parse_set, resolve_recipe, \
    scaled_lrs, validate_recipe

__all__ = ['add_arguments', 'run', 'main', 'CHECKPOINT_KEY', 'load_checkpoint']

# Marks a training checkpoint (value: its layout version). Not 'format': tcnn.io reserves that key for T-CNN files
# and recognises a checkpoint by its 'model_file' entry.
CHECKPOINT_KEY = 'tcnn_checkpoint'
CHECKPOINT_VERSION = 1
METRICS_FILE = 'metrics.jsonl'
CONFIG_FILE = 'config.yaml'
# Keys a resumed run cannot change: they define the model or the optimiser's parameter layout.
FROZEN_ON_RESUME = ('model', 'num_classes', 'no_sa', 'reparam_epoch', 'stages', 'qk_dim', 'locality_strength',
                    'gating_init', 'opt', 'drop_path_rate')
# If these are unchanged on resume, the saved scheduler state is loaded as is; otherwise it is rebuilt.
SCHEDULE_KEYS = ('sched', 'epochs', 'warmup_epochs', 'warmup_lr', 'min_lr', 'lr', 'gating_lr', 'lr_base_batch',
                 'scale_lr')

# (flag, recipe key, argparse kwargs): the named overrides. Everything else goes through --set KEY=VALUE.
_FLAGS: Tuple[Tuple[str, str, Dict[str, Any]], ...] = (
    ('--data', 'data', {'metavar': 'DIR'}),
    ('--output', 'output', {'metavar': 'DIR'}),
    ('--model', 'model', {'metavar': 'NAME'}),
    ('--weights', 'weights', {'metavar': 'PATH'}),
    ('--no-pretrained', 'pretrained', {'action': 'store_const', 'const': False}),
    ('--epochs', 'epochs', {'type': int, 'metavar': 'N'}),
    ('--batch-size', 'batch_size', {'type': int, 'metavar': 'N'}),
    ('--accum-steps', 'accum_steps', {'type': int, 'metavar': 'N'}),
    ('--lr', 'lr', {'type': float, 'metavar': 'LR'}),
    ('--gating-lr', 'gating_lr', {'type': float, 'metavar': 'LR'}),
    ('--img-size', 'img_size', {'type': int, 'metavar': 'PX'}),
    ('--workers', 'workers', {'type': int, 'metavar': 'N'}),
    ('--device', 'device', {'metavar': 'DEV'}),
    ('--amp', 'amp', {'nargs': '?', 'const': 'bf16', 'choices': ('auto', 'bf16', 'fp16', 'none'), 'metavar': 'MODE'}),
    ('--no-sa', 'no_sa', {'action': 'store_const', 'const': True}),
    ('--reparam-epoch', 'reparam_epoch', {'type': int, 'metavar': 'N'}),
    ('--seed', 'seed', {'type': int, 'metavar': 'N'}),
    ('--compile', 'compile', {'action': 'store_const', 'const': True}),
    ('--model-ema', 'model_ema', {'action': 'store_const', 'const': True}),
    ('--no-progress', 'progress', {'action': 'store_const', 'const': False}),
)


# ---------------------------------------------------------------------------------------------------- arguments

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tcnn train`` and ``python -m tcnn.train`` (one definition for both)."""
    parser.add_argument('--recipe', metavar='YAML', help='recipe file, or the name of a bundled one (t_resnet50_rs ... '
                        't_resnet350_rs, t_resnet50_d ... t_resnet200_d); default: the paper\'s shared settings with '
                        'model resnet50d')
    parser.add_argument('--resume', metavar='PATH', help='continue a run from its OUTPUT/last.pt (the recipe comes '
                        'from the checkpoint; flags and --set still override it)')
    parser.add_argument('--set', dest='set_items', action='append', default=[], metavar='KEY=VALUE',
                        help='override any recipe key (value read as YAML), e.g. --set mixup=0 --set stages=[3,4]; '
                        'applied after the named flags')
    parser.add_argument('--print-config', action='store_true', help='print the resolved recipe and exit')
    group = parser.add_argument_group('recipe overrides')
    for flag, key, kwargs in _FLAGS:
        spec = RECIPE_KEYS[key]
        help_text = f'{spec.help} (recipe key {key})'
        group.add_argument(flag, dest=key, default=None, help=help_text, **kwargs)


def _flag_overrides(args: argparse.Namespace) -> Dict[str, Any]:
    return {key: getattr(args, key) for _, key, _ in _FLAGS if getattr(args, key, None) is not None}


def _resolve(args: argparse.Namespace, checkpoint: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    if checkpoint is None:
        recipe = resolve_recipe(args.recipe, _flag_overrides(args), args.set_items)
        if recipe['output'] is None:
            stem = os.path.splitext(os.path.basename(args.recipe))[0] if args.recipe else recipe['model']
            recipe['output'] = os.path.join('runs', stem.replace(':', '_'))
        return recipe
    if args.recipe:
        raise TcnnError('--recipe cannot be combined with --resume: the run\'s recipe is in the checkpoint; '
                        'override single keys with flags or --set')
    recipe = default_recipe()
    apply_overrides(recipe, checkpoint['config'], f'the checkpoint {args.resume}')
    overrides = dict(_flag_overrides(args), **parse_set(args.set_items))
    changed = [k for k in FROZEN_ON_RESUME if k in overrides and overrides[k] != recipe[k]]
    if changed:
        raise TcnnError(f'cannot change {", ".join(changed)} when resuming (they define the model and the '
                        'optimiser); start a new run instead')
    apply_overrides(recipe, overrides)
    if 'output' not in overrides:
        recipe['output'] = os.path.dirname(os.path.abspath(args.resume))
    return validate_recipe(recipe)


# ---------------------------------------------------------------------------------------------------- distributed

@dataclasses.dataclass
class DistContext:
    """Where this process runs and which part of the job it is."""
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    distributed: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _setup_distributed(device_name: str) -> DistContext:
    """Device and process group from the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK)."""
    world = int(os.environ.get('WORLD_SIZE', '1'))
    rank = int(os.environ.get('RANK', '0'))
    local_rank = int(os.environ.get('LOCAL_RANK', '0'))
    if device_name == 'auto':
        device_name = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device_name.startswith('cuda'):
        if not torch.cuda.is_available():
            raise TcnnError(f'device {device_name} requested but CUDA is not available (use --device cpu)')
        device = torch.device('cuda', local_rank if world > 1 or device_name == 'cuda' else
                              torch.device(device_name).index or 0)
        torch.cuda.set_device(device)
    else:
        device = torch.device('cpu')
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend='nccl' if device.type == 'cuda' else 'gloo')
    return DistContext(rank, world, local_rank, device, world > 1)


def _cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _gather(obj: Any, ctx: DistContext) -> List[Any]:
    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


# ---------------------------------------------------------------------------------------------------- rng states

def _rng_state() -> Dict[str, Any]:
    """RNG states as tensors/lists/numbers only, so checkpoints load with ``weights_only=True``."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        'torch': torch.get_rng_state(),
        'cuda': list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else [],
        'numpy': [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]), int(np_state[3]),
                  float(np_state[4])],
        'python': [py_state[0], list(py_state[1]), py_state[2]],
    }


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state['torch'])
    if state['cuda'] and torch.cuda.is_available() and len(state['cuda']) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state['cuda'])
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------------------------------- files

def _read_metrics(path: str) -> List[Dict[str, Any]]:
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_metrics(path: str, rows: Sequence[Dict[str, Any]]) -> None:
    atomic_write_text(path, ''.join(json.dumps(r) + '\n' for r in rows))


def load_checkpoint(path: str) -> Dict[str, Any]:
    """Read a training checkpoint (``OUTPUT/last.pt`` or ``best.pt``) with ``weights_only=True``."""
    if not os.path.isfile(path):
        raise TcnnError(f'checkpoint not found: {path}')
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        raise TcnnError(f'cannot read checkpoint {path}: {type(e).__name__}: {str(e).splitlines()[0]}') from e
    if not isinstance(ckpt, dict) or CHECKPOINT_KEY not in ckpt or 'model_file' not in ckpt:
        raise TcnnError(f'{path} is not a tcnn training checkpoint (OUTPUT/last.pt or OUTPUT/best.pt of tcnn train)')
    if not isinstance(ckpt[CHECKPOINT_KEY], int) or ckpt[CHECKPOINT_KEY] > CHECKPOINT_VERSION:
        raise TcnnError(f'{path} has training-checkpoint layout {ckpt[CHECKPOINT_KEY]!r}; this tcnn reads up to '
                        f'{CHECKPOINT_VERSION}: upgrade tcnn')
    return ckpt


# ---------------------------------------------------------------------------------------------------- data

def _image_folder(root: str, split: str, class_map: Optional[Dict[str, int]] = None):
    """A timm ``ImageDataset`` of ``root/split``; with ``class_map`` (the training set's), its labels use the same
    indices and a class the map lacks is an error."""
    from timm.data import ImageDataset
    path = os.path.join(root, split)
    if not os.path.isdir(path):
        raise TcnnError(f'data folder not found: {path} (expected the ImageFolder layout DATA/{split}/CLASS/IMAGE)')
    try:
        dataset = ImageDataset(path)
    except RuntimeError as e:  # timm: 'Found 0 images in subfolders of ...'
        raise TcnnError(f'no images in {path} (expected the ImageFolder layout DATA/{split}/CLASS/IMAGE; '
                        f'{str(e).splitlines()[0]})') from None
    if class_map is not None and dataset.reader.class_to_idx != class_map:
        unknown = sorted(set(dataset.reader.class_to_idx) - set(class_map))
        if unknown:
            raise TcnnError(f'{path} has classes that the training set lacks: {", ".join(unknown[:5])}')
        dataset = ImageDataset(path, class_map=class_map)  # a subset of the classes: use the training indices
    return dataset


def _data_config(recipe: Dict[str, Any], model: nn.Module) -> Dict[str, Any]:
    """Eval preprocessing: the model's pretrained config, overridden by the recipe."""
    from timm.data import resolve_data_config
    cfg = resolve_data_config({}, model=model)
    size = recipe['eval_img_size'] or recipe['img_size']
    return {
        'input_size': [3, size, size],
        'interpolation': recipe['interpolation'] or cfg['interpolation'],
        'mean': list(recipe['mean'] or cfg['mean']),
        'std': list(recipe['std'] or cfg['std']),
        'crop_pct': recipe['crop_pct'] if recipe['crop_pct'] is not None else cfg['crop_pct'],
        'crop_mode': cfg.get('crop_mode', 'center'),
    }


def _transforms(recipe: Dict[str, Any], data_cfg: Dict[str, Any]):
    from timm.data import create_transform
    train = create_transform(
        recipe['img_size'], is_training=True, auto_augment=recipe['aa'], color_jitter=recipe['color_jitter'],
        re_prob=recipe['reprob'], re_mode=recipe['remode'], re_count=recipe['recount'],
        interpolation=data_cfg['interpolation'], mean=tuple(data_cfg['mean']), std=tuple(data_cfg['std']))
    val = create_transform(
        data_cfg['input_size'][-1], is_training=False, interpolation=data_cfg['interpolation'],
        mean=tuple(data_cfg['mean']), std=tuple(data_cfg['std']), crop_pct=data_cfg['crop_pct'],
        crop_mode=data_cfg['crop_mode'])
    return train, val


# ---------------------------------------------------------------------------------------------------- model

@contextlib.contextmanager
def _full_precision_matmul():
    """Verify conversions in true fp32: TF32 convs/matmuls on GPU would exceed the 1e-4 equivalence tolerance."""
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    precision = torch.get_float32_matmul_precision()
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision('highest')
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        torch.set_float32_matmul_precision(precision)


def _convert_in_place(model: nn.Module, recipe: Dict[str, Any]) -> List[torch.Tensor]:
    """Replace the k x k convs of ``model`` by verified GPSA layers, keeping every other parameter object (so an
    optimiser that holds them keeps its state). Returns the replaced conv parameters."""
    removed = [p for _, conv in find_convertible_convs(model, recipe['stages']) for p in conv.parameters()]
    with _full_precision_matmul():
        reparameterize_(model, stages=recipe['stages'], locality_strength=recipe['locality_strength'],
                        gating_init=recipe['gating_init'], qk_dim=recipe['qk_dim'], verify=True,
                        input_size=(3, recipe['img_size'], recipe['img_size']))
    return removed


def _create_model(recipe: Dict[str, Any], num_classes: int) -> nn.Module:
    kwargs = {}
    if recipe['drop_path_rate'] > 0:
        kwargs['drop_path_rate'] = recipe['drop_path_rate']
    try:
        return create_cnn(recipe['model'], pretrained=recipe['pretrained'], weights=recipe['weights'],
                          num_classes=num_classes, **kwargs)
    except TypeError as e:  # a timm architecture that does not take one of the kwargs
        raise TcnnError(f'cannot create {recipe["model"]} with {kwargs}: {e}') from None


def _copy_gpsa_init(src: nn.Module, dst: nn.Module) -> None:
    """Give ``dst``'s GPSA layers ``src``'s content/positional initialisation (everything but the loaded filter)."""
    src_layers = dict(gpsa_layers(src))
    with torch.no_grad():
        for name, layer in gpsa_layers(dst):
            for pname, param in layer.named_parameters():
                if not pname.startswith('proj_'):
                    param.copy_(getattr(src_layers[name], pname))


# ---------------------------------------------------------------------------------------------------- trainer

def _fmt(v: Optional[float], spec: str = '.4g') -> str:
    return 'n/a' if v is None else format(v, spec)


class Trainer:
    """State of one training run (model, optimiser, scheduler, EMA, loaders) and its epoch loop."""

    def __init__(self, recipe: Dict[str, Any], ctx: DistContext, checkpoint: Optional[Dict[str, Any]] = None):
        self.recipe = recipe
        self.ctx = ctx
        self.device = ctx.device
        self.output = recipe['output']
        self.log = print if ctx.is_main else (lambda *a, **k: None)
        self.metrics_path = os.path.join(self.output, METRICS_FILE)
        self.last_path = os.path.join(self.output, 'last.pt')
        self.best_path = os.path.join(self.output, 'best.pt')
        self.start_epoch = 0
        self.best_top1 = -math.inf
        self.model_ema = None
        self.scaler = None
        self._setup_precision()
        self._setup_data()
        self._setup_model(checkpoint)
        self._setup_optimisation()
        self._setup_loss()
        self._wrap()
        if checkpoint is not None:
            self._restore(checkpoint)
        else:
            if ctx.is_main:
                _write_metrics(self.metrics_path, [])  # a fresh run starts a fresh file
            # same model init on every rank (above); different augmentation streams per rank from here on
            _seed_all(recipe['seed'] + ctx.rank)

    # -------------------------------------------------------------- set-up

    def _setup_precision(self) -> None:
        amp = self.recipe['amp']
        if amp == 'auto':
            amp = 'bf16' if self.device.type == 'cuda' else 'none'
        if amp == 'fp16' and self.device.type != 'cuda':
            raise TcnnError('amp fp16 needs a GPU (use bf16 or none on CPU)')
        self.amp_dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'none': None}[amp]
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=amp == 'fp16')
        cl = self.recipe['channels_last']
        self.channels_last = self.device.type == 'cuda' if cl is None else cl

    def _setup_data(self) -> None:
        r, ctx = self.recipe, self.ctx
        if not r['data']:
            raise TcnnError('no data: pass --data DIR (ImageFolder layout with train/ and val/)')
        if not os.path.isdir(r['data']):
            raise TcnnError(f'data folder not found: {r["data"]}')
        self.train_set = _image_folder(r['data'], r['train_split'])
        class_map = self.train_set.reader.class_to_idx
        self.val_set = _image_folder(r['data'], r['val_split'], class_map=class_map)
        classes = len(class_map)
        if r['num_classes'] is None:
            r['num_classes'] = classes
        elif r['num_classes'] < classes:
            raise TcnnError(f'num_classes {r["num_classes"]} is smaller than the {classes} class folders of the data')
        self.global_batch = r['batch_size'] * ctx.world_size * r['accum_steps']
        per_rank = len(self.train_set) // ctx.world_size
        self.updates_per_epoch = per_rank // r['batch_size'] // r['accum_steps']
        if self.updates_per_epoch == 0:
            raise TcnnError(f'the training set ({len(self.train_set)} images) is smaller than one update of '
                            f'{self.global_batch} images (batch_size x processes x accum_steps): lower --batch-size '
                            'or --accum-steps')

    def _build_loaders(self, data_cfg: Dict[str, Any]) -> None:
        from torch.utils.data import DataLoader, DistributedSampler, Subset
        r, ctx = self.recipe, self.ctx
        self.train_set.transform, self.val_set.transform = _transforms(r, data_cfg)
        # DistributedSampler also for one process: the order is a function of (seed, epoch), so resume is exact
        self.train_sampler = DistributedSampler(self.train_set, num_replicas=ctx.world_size, rank=ctx.rank,
                                                shuffle=True, seed=r['seed'], drop_last=True)
        pin = r['pin_memory'] and self.device.type == 'cuda'
        # Non-persistent workers are re-seeded from the (checkpointed) torch RNG every epoch: exact resume.
        self.train_loader = DataLoader(self.train_set, batch_size=r['batch_size'], sampler=self.train_sampler,
                                       num_workers=r['workers'], pin_memory=pin, drop_last=True)
        # Validation shards without padding (rank::world), so the summed metrics count every image once.
        val_shard = Subset(self.val_set, list(range(ctx.rank, len(self.val_set), ctx.world_size)))
        self.val_loader = DataLoader(val_shard, batch_size=r['batch_size'], shuffle=False,
                                     num_workers=r['workers'], pin_memory=pin)

    def _setup_model(self, checkpoint: Optional[Dict[str, Any]]) -> None:
        r = self.recipe
        self.late = r['reparam_epoch'] is not None and r['reparam_epoch'] > 0 and not r['no_sa']
        _seed_all(r['seed'])
        if checkpoint is not None:
            from .io import model_from_dict
            model = model_from_dict(checkpoint['model_file'], map_location='cpu')
            self.converted = bool(checkpoint['converted'])
            model.train()
            model.to(self.device)
        else:
            model = _create_model(r, r['num_classes']).to(self.device)
            self.converted = False
            if not r['no_sa'] and not self.late:
                _convert_in_place(model, r)
                self.converted = True
                self._log_conversion(model)
        self.data_config = _data_config(r, model)
        self._build_loaders(self.data_config)
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        if self.device.type == 'cuda':  # TF32 for training speed (conversions are verified in full fp32)
            torch.set_float32_matmul_precision('high')
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        self.model = model

    def _log_conversion(self, model: nn.Module) -> None:
        layers = model.tcnn_config['layers']
        self.log(f'reparameterised {len(layers)} convs of {self.recipe["model"]} into GPSA layers '
                 f'({", ".join(layers)}); verified {model.tcnn_report}')

    def _setup_optimisation(self) -> None:
        r = self.recipe
        self.lrs = scaled_lrs(r, self.global_batch)
        # a resumed late-reparameterisation run that is converted already gets the layout the conversion produced
        self.optimizer = create_optimizer(self.model, r, self.lrs['lr'], self.lrs['gating_lr'],
                                          gpsa_separate=self.late and self.converted)
        self.scheduler = create_scheduler(self.optimizer, r, self.updates_per_epoch, self.lrs['warmup_lr'],
                                          self.lrs['min_lr'])
        self.num_updates = 0
        if r['model_ema']:
            from timm.utils import ModelEmaV3
            self.model_ema = ModelEmaV3(self.model, decay=r['model_ema_decay'])

    def _setup_loss(self) -> None:
        """DeiT's: mixup/cutmix with smoothed soft targets, else label smoothing, else plain cross-entropy."""
        r = self.recipe
        if r['mixup'] > 0 or r['cutmix'] > 0:
            from timm.data import Mixup
            from timm.loss import SoftTargetCrossEntropy
            self.mixup_fn = Mixup(mixup_alpha=r['mixup'], cutmix_alpha=r['cutmix'], prob=r['mixup_prob'],
                                  switch_prob=r['mixup_switch_prob'], mode=r['mixup_mode'],
                                  label_smoothing=r['smoothing'], num_classes=r['num_classes'])
            self.criterion = SoftTargetCrossEntropy()
        elif r['smoothing'] > 0:
            from timm.loss import LabelSmoothingCrossEntropy
            self.mixup_fn = None
            self.criterion = LabelSmoothingCrossEntropy(smoothing=r['smoothing'])
        else:
            self.mixup_fn = None
            self.criterion = nn.CrossEntropyLoss()

    def _wrap(self) -> None:
        """DDP and torch.compile around the raw model (again after a late reparameterisation)."""
        model = self.model
        if self.ctx.distributed:
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == 'cuda' else None)
        if self.recipe['compile']:
            model = torch.compile(model)
        self.train_model = model

    def _restore(self, ckpt: Dict[str, Any]) -> None:
        r = self.recipe
        self.optimizer.load_state_dict(ckpt['optimizer'])
        # load_state_dict brings back the saved group settings; the (possibly overridden) recipe decides them
        apply_group_settings(self.optimizer, self.lrs['lr'], self.lrs['gating_lr'], r['weight_decay'])
        old = ckpt['config']
        self.start_epoch = ckpt['epoch'] + 1
        self.num_updates = self.start_epoch * self.updates_per_epoch
        same_schedule = (all(old.get(k) == r[k] for k in SCHEDULE_KEYS) and ckpt.get('global_batch') ==
                         self.global_batch and ckpt.get('updates_per_epoch') == self.updates_per_epoch)
        if same_schedule:
            self.scheduler.load_state_dict(ckpt['scheduler'])
        else:
            self.log('note: the schedule or the global batch changed since the checkpoint; the learning rate follows '
                     'the new settings from the resumed epoch on')
        self.scheduler.step_update(self.num_updates)
        if ckpt.get('scaler'):
            self.scaler.load_state_dict(ckpt['scaler'])
        if self.model_ema is not None and ckpt.get('ema') is not None:
            self.model_ema.module.load_state_dict(ckpt['ema'])
        self.best_top1 = ckpt['best_top1'] if ckpt.get('best_top1') is not None else -math.inf
        if self.ctx.is_main:
            rows = [m for m in _read_metrics(self.metrics_path) if m['epoch'] < self.start_epoch]
            _write_metrics(self.metrics_path, rows)  # drop epochs the checkpoint does not hold
        rng = ckpt.get('rng') or []
        if len(rng) == self.ctx.world_size:
            _set_rng_state(rng[self.ctx.rank])
        else:
            self.log(f'note: the checkpoint holds RNG states of {len(rng)} processes, this run has '
                     f'{self.ctx.world_size}: data order is kept, augmentation draws are re-seeded')
            _seed_all(r['seed'] + self.ctx.rank + 1000 * self.start_epoch)
        self.log(f'resuming after epoch {ckpt["epoch"] + 1}/{r["epochs"]} (update {self.num_updates})')

    # -------------------------------------------------------------- late reparameterisation

    def _late_reparameterize(self) -> None:
        """Table 3: convert now and continue with the same optimiser; the GPSA parameters join it as new groups and
        the scheduler is rebuilt over all groups at the current position."""
        r = self.recipe
        removed = _convert_in_place(self.model, r)
        self.converted = True
        self._log_conversion(self.model)
        add_gpsa_groups(self.optimizer, self.model, removed, r['weight_decay'],
                        self.lrs['gating_lr'] / self.lrs['lr'])
        self.scheduler = create_scheduler(self.optimizer, r, self.updates_per_epoch, self.lrs['warmup_lr'],
                                          self.lrs['min_lr'])
        self.scheduler.step_update(self.num_updates)
        self._wrap()  # DDP broadcasts rank 0's new GPSA parameters to the other ranks here
        if self.model_ema is not None:
            # the EMA keeps its averaged CNN weights; its GPSA layers start from the model's (synchronised) init
            _convert_in_place(self.model_ema.module, r)
            _copy_gpsa_init(self.model, self.model_ema.module)

    # -------------------------------------------------------------- checkpoints and metrics

    def _checkpoint(self, epoch: int) -> Dict[str, Any]:
        from .io import model_to_dict
        return {
            CHECKPOINT_KEY: CHECKPOINT_VERSION,
            'model_file': model_to_dict(self.model, data_config=self.data_config),
            'converted': self.converted,
            'ema': self.model_ema.module.state_dict() if self.model_ema is not None else None,
            'optimizer': self.optimizer.state_dict(),
            'scheduler': self.scheduler.state_dict(),
            'scaler': self.scaler.state_dict(),
            'epoch': epoch,
            'num_updates': self.num_updates,
            'updates_per_epoch': self.updates_per_epoch,
            'global_batch': self.global_batch,
            'world_size': self.ctx.world_size,
            'config': dict(self.recipe),
            'best_top1': self.best_top1 if math.isfinite(self.best_top1) else None,
        }

    def _save(self, epoch: int, row: Dict[str, Any], is_best: bool) -> None:
        rng = _gather(_rng_state(), self.ctx)  # every rank's RNG, so that each resumes its own stream
        if not self.ctx.is_main:
            return
        _write_metrics(self.metrics_path, _read_metrics(self.metrics_path) + [row])
        ckpt = self._checkpoint(epoch)
        ckpt['rng'] = rng
        if is_best:
            atomic_torch_save(ckpt, self.best_path)
            atomic_copy(self.best_path, self.last_path)
        else:
            atomic_torch_save(ckpt, self.last_path)

    # -------------------------------------------------------------- loop

    def describe(self) -> None:
        r, ctx = self.recipe, self.ctx
        kind = 'no-SA baseline' if r['no_sa'] else 'T-CNN'
        if self.late:
            kind += f', reparameterised after {r["reparam_epoch"]} CNN epochs'
        self.log(f'model {r["model"]} ({kind}), '
                 f'{sum(p.numel() for p in self.model.parameters()) / 1e6:.2f}M params, {r["num_classes"]} classes, '
                 f'device {self.device}, {ctx.world_size} process(es), amp {self.amp_dtype or "none"}')
        self.log(f'data {r["data"]}: {len(self.train_set)} train / {len(self.val_set)} val images, '
                 f'{r["img_size"]} px; global batch {self.global_batch} = {r["batch_size"]} x {ctx.world_size} '
                 f'process(es) x {r["accum_steps"]} accum, {self.updates_per_epoch} updates/epoch')
        rule = (f'recipe values x {self.lrs["factor"]:.4g} = global batch {self.global_batch} / '
                f'{r["lr_base_batch"]}' if r['scale_lr'] else 'recipe values, scale_lr off')
        self.log(f'lr {self.lrs["lr"]:.3g}, gating lr {self.lrs["gating_lr"]:.3g} ({rule}); {r["warmup_epochs"]} '
                 f'warm-up epochs from {self.lrs["warmup_lr"]:.3g}, {r["sched"]} decay to {self.lrs["min_lr"]:.3g}')
        self.log(f'output {self.output}')

    def fit(self) -> int:
        r, ctx = self.recipe, self.ctx
        if self.start_epoch >= r['epochs']:
            self.log(f'nothing to do: the run already has {r["epochs"]} epochs (raise --epochs to continue it)')
            return 0
        for epoch in range(self.start_epoch, r['epochs']):
            if self.late and not self.converted and epoch >= r['reparam_epoch']:
                self._late_reparameterize()
            self.train_sampler.set_epoch(epoch)
            try:
                stats = train_one_epoch(
                    self.train_model, self.train_loader, self.optimizer, self.criterion, device=self.device,
                    epoch=epoch, updates_per_epoch=self.updates_per_epoch, num_updates=self.num_updates,
                    scheduler=self.scheduler, accum_steps=r['accum_steps'], mixup_fn=self.mixup_fn,
                    amp_dtype=self.amp_dtype, scaler=self.scaler, clip_grad=r['clip_grad'], model_ema=self.model_ema,
                    ema_source=self.model, channels_last=self.channels_last, progress=r['progress'] and ctx.is_main,
                    desc=f'epoch {epoch + 1}/{r["epochs"]}')
            except NonFiniteLossError as e:
                kept = (f'the last good checkpoint {self.last_path} (epoch {epoch}/{r["epochs"]}) is kept'
                        if os.path.isfile(self.last_path) else 'no checkpoint was written yet')
                raise NonFiniteLossError(f'{e}; {kept}; lower --lr/--gating-lr or try --amp none') from None
            self.num_updates = stats['num_updates']
            eval_start = time.perf_counter()
            val = evaluate(self.model, self.val_loader, device=self.device, amp_dtype=self.amp_dtype,
                           channels_last=self.channels_last)
            row = {'epoch': epoch, 'lr': stats['lr'], 'gating_lr': stats['gating_lr'],
                   'train_loss': stats['train_loss'], 'train_top1': stats['train_top1'], **val,
                   'img_per_s': stats['img_per_s'], 'train_images': stats['train_images'],
                   'epoch_time_s': None, 'gpsa': gpsa_summary(self.model)}
            if self.model_ema is not None:
                row.update(evaluate(self.model_ema.module, self.val_loader, device=self.device,
                                    amp_dtype=self.amp_dtype, channels_last=self.channels_last, prefix='ema_val'))
            row['epoch_time_s'] = stats['train_time_s'] + time.perf_counter() - eval_start
            is_best = val['val_top1'] > self.best_top1
            self.best_top1 = max(self.best_top1, val['val_top1'])
            self._save(epoch, row, is_best)
            self.log(self._summary(row, r['epochs']))
        self.log(f'done: best val top-1 {self.best_top1:.2f}%; checkpoints {self.last_path}, {self.best_path}')
        return 0

    @staticmethod
    def _summary(row: Dict[str, Any], epochs: int) -> str:
        gates = [v['gate_mean'] for v in row['gpsa'].values()]
        spans = [v['span_mean'] for v in row['gpsa'].values()]
        gpsa = (f', gate {np.mean(gates):.3f}, span {np.mean(spans):.3f}' if gates else '')
        return (f'epoch {row["epoch"] + 1}/{epochs}: train loss {row["train_loss"]:.4f}, val loss '
                f'{row["val_loss"]:.4f}, top-1 {row["val_top1"]:.2f}%, top-5 {row["val_top5"]:.2f}%, lr '
                f'{_fmt(row["lr"], ".3g")}, gating lr {_fmt(row["gating_lr"], ".3g")}, '
                f'{_fmt(row["img_per_s"], ".1f")} img/s, {row["epoch_time_s"]:.1f} s{gpsa}')


# ---------------------------------------------------------------------------------------------------- entry points

def _prepare_output(recipe: Dict[str, Any], resuming: bool, ctx: DistContext) -> None:
    output = recipe['output']
    if not resuming and os.path.isfile(os.path.join(output, 'last.pt')):
        raise TcnnError(f'{output} already holds a run (last.pt): continue it with --resume '
                        f'{os.path.join(output, "last.pt")} or choose another --output')
    if ctx.is_main:
        os.makedirs(output, exist_ok=True)


def run(args: argparse.Namespace) -> int:
    """Run ``tcnn train`` with parsed arguments; user mistakes raise ``TcnnError``."""
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    recipe = _resolve(args, checkpoint)
    if args.print_config:
        print(dump_recipe(recipe), end='')
        return 0
    ctx = _setup_distributed(recipe['device'])
    trainer = None
    try:
        _prepare_output(recipe, checkpoint is not None, ctx)
        trainer = Trainer(recipe, ctx, checkpoint)
        del checkpoint
        if ctx.is_main:
            atomic_write_text(os.path.join(recipe['output'], CONFIG_FILE), dump_recipe(recipe))
        trainer.describe()
        return trainer.fit()
    except KeyboardInterrupt:
        if ctx.is_main:
            last = os.path.join(recipe['output'], 'last.pt')
            where = (f'{last} holds the last completed epoch; continue with --resume {last}'
                     if os.path.isfile(last) else 'no epoch was completed')
            print(f'interrupted: {where}', file=sys.stderr)
        return 130
    finally:
        _cleanup_distributed()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m tcnn.train`` / ``torchrun -m tcnn.train``: errors print as one line (``--debug``: traceback)."""
    parser = argparse.ArgumentParser(prog='python -m tcnn.train', description=__doc__.split('\n\n')[0])
    parser.add_argument('--debug', action='store_true', help='show tracebacks of errors')
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except TcnnError as e:
        if args.debug:
            raise
        if int(os.environ.get('RANK', '0')) == 0:  # the other ranks fail the same way; one line is enough
            print(f'tcnn train: error: {e}', file=sys.stderr)
        return 2


if __name__ == '__main__':
    sys.exit(main())
