"""Fine-tuning recipes: the keys, their defaults (the paper's shared settings), YAML files and overrides.

A recipe is a flat dict. ``RECIPE_KEYS`` is its schema: every key has a default, the types it accepts and a help
line. The defaults are the shared fine-tuning settings of T-CNN (arXiv:2106.05795, section 3): 50 epochs, AdamW,
global batch 1024, lr 1e-4 after a 5-epoch warm-up then cosine decay, gating lr 0.1, DeiT augmentation. A YAML file
may name a ``base`` file (relative to itself) whose keys it extends. Precedence, lowest first: defaults, base file,
recipe file, named command-line flags (``--lr``), ``--set key=value``. The learning rates of the defaults and of
recipe files are given at the reference batch ``lr_base_batch`` and scaled with the run's global batch; one given on
the command line is absolute (``absolute_lrs``, timm's rule).
"""
import dataclasses
import difflib
import math
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import yaml

from .compiling import COMPILE_MODES, compile_mode
from ..errors import TcnnError

__all__ = ['RecipeKey', 'RECIPE_KEYS', 'LR_KEYS', 'LOG_BACKENDS', 'default_recipe', 'load_recipe', 'parse_set',
           'apply_overrides', 'validate_recipe', 'resolve_recipe', 'fit_warmup', 'mark_absolute_lrs', 'dump_recipe',
           'scaled_lrs', 'auto_workers']

# The learning rates the batch rule scales (``scaled_lrs``), unless the user gave them (``absolute_lrs``).
LR_KEYS = ('lr', 'gating_lr', 'warmup_lr', 'min_lr')

# Live dashboards of `tcnn train --log` (tcnn.train.dashboards), each an optional extra of the same name.
LOG_BACKENDS = ('tensorboard', 'wandb')
BASE_KEY = 'base'  # names a parent recipe file; resolved while loading, never part of the resolved recipe
NoneType = type(None)


@dataclasses.dataclass(frozen=True)
class RecipeKey:
    """Schema of one recipe key."""
    default: Any
    types: Tuple[type, ...]
    help: str
    choices: Optional[Tuple[Any, ...]] = None


def _k(default: Any, types: Any, help_text: str, choices: Optional[Tuple[Any, ...]] = None) -> RecipeKey:
    return RecipeKey(default, types if isinstance(types, tuple) else (types,), help_text, choices)


RECIPE_KEYS: Dict[str, RecipeKey] = {
    # model and conversion
    'model': _k('resnet50d', str, 'source CNN: a timm name (resnetrs50, resnet50d, ...) or torchvision:NAME'),
    'pretrained': _k(True, bool, "start from the library's pretrained weights (false: random init)"),
    'weights': _k(None, (str, NoneType), 'local checkpoint of the source CNN (instead of downloading)'),
    'num_classes': _k(None, (int, NoneType), 'classifier size; null: the class count of the data (class folders, '
                      'class names); set it for data that does not state it (webdataset labels), else it must agree'),
    'drop_path_rate': _k(0.0, float, 'stochastic depth rate (Table 1: 0.1 for RS-50/101, 0.2 for larger)'),
    'no_sa': _k(False, bool, 'Table 1 "without SA" baseline: fine-tune the unconverted CNN'),
    'reparam_epoch': _k(None, (int, NoneType), 'Table 3 late reparameterisation: train the CNN this many epochs, '
                        'then convert and continue with the same optimiser (null: convert at the start)'),
    'stages': _k(None, (int, str, list, NoneType),
                 'stages whose k x k convs become GPSA (null: the default; see tcnn convert --list-stages MODEL)'),
    'locality_strength': _k(1.0, float, 'initial alpha of every head (paper: 1.0, on the verge of locality)'),
    'gating_init': _k(1.0, float, 'initial lambda of every head (paper: 1.0)'),
    'qk_dim': _k(None, (int, NoneType), 'per-head query/key width (null: min(C_in // heads, C_in // groups))'),
    # data
    'data': _k(None, (str, NoneType), 'dataset root in ImageFolder layout, with train/ and val/ class folders'),
    'train_split': _k('train', str, 'training sub-folder of the data root'),
    'val_split': _k('val', str, 'validation sub-folder of the data root'),
    'img_size': _k(224, int, 'fine-tuning resolution (Tables 1 and 5)'),
    'eval_img_size': _k(None, (int, NoneType), 'evaluation resolution (null: img_size)'),
    'crop_pct': _k(None, (float, NoneType), "evaluation centre-crop fraction (null: the model's default)"),
    'interpolation': _k('bicubic', (str, NoneType), "resize interpolation (null: the model's default)",
                        ('bilinear', 'bicubic', 'nearest', 'random', None)),
    'mean': _k(None, (list, NoneType), "normalisation mean (null: the model's default)"),
    'std': _k(None, (list, NoneType), "normalisation std (null: the model's default)"),
    'workers': _k(None, (int, NoneType), 'data-loading processes per training process (null: sized to the machine, '
                  'the CPUs of this process shared by the local training processes, at most 8)'),
    'skip_bad_images': _k(False, bool, 'replace unreadable or truncated training/validation images by readable ones '
                          '(logged once each) instead of stopping'),
    'pin_memory': _k(True, bool, 'pin host memory of batches (GPU only)'),
    # augmentation (DeiT)
    'aa': _k('rand-m9-mstd0.5-inc1', (str, NoneType), 'timm auto-augment policy (null: none)'),
    'color_jitter': _k(0.3, float, 'colour jitter (timm ignores it when a RandAugment policy is set)'),
    'scale': _k([0.08, 1.0], list, 'area range of the random resized crop, as fractions of the image (timm/DeiT '
                '--scale; [1.0, 1.0]: the whole image, for labels that a crop can change)'),
    'reprob': _k(0.25, float, 'random erasing probability'),
    'remode': _k('pixel', str, 'random erasing mode', ('pixel', 'rand', 'const')),
    'recount': _k(1, int, 'random erasing count'),
    'mixup': _k(0.8, float, 'mixup alpha (0: off)'),
    'cutmix': _k(1.0, float, 'cutmix alpha (0: off)'),
    'mixup_prob': _k(1.0, float, 'probability of applying mixup or cutmix to a batch'),
    'mixup_switch_prob': _k(0.5, float, 'probability of cutmix instead of mixup when both are on'),
    'mixup_mode': _k('batch', str, 'mixup granularity', ('batch', 'pair', 'elem')),
    'smoothing': _k(0.1, float, 'label smoothing'),
    # optimisation
    'epochs': _k(50, int, 'fine-tuning epochs (SM C also reports 10 and 20)'),
    'batch_size': _k(128, int, 'batch per process (global batch = batch_size x processes x accum_steps)'),
    'accum_steps': _k(1, int, 'micro-batches accumulated per optimiser update'),
    'opt': _k('adamw', str, 'timm optimiser name (the paper: AdamW; SGD was worse)'),
    'opt_eps': _k(1e-8, (float, NoneType), 'optimiser epsilon (null: its default)'),
    'opt_betas': _k(None, (list, NoneType), 'optimiser betas (null: its default)'),
    'momentum': _k(0.9, float, 'momentum of SGD-like optimisers'),
    'weight_decay': _k(0.05, float, 'weight decay of weights (not of norms, biases, positional or gating params)'),
    'lr': _k(1e-4, float, 'peak learning rate at the reference global batch lr_base_batch (given by --lr or --set: '
             'as is)'),
    'gating_lr': _k(0.1, float, 'peak learning rate of the gating parameters at lr_base_batch (given: as is)'),
    'lr_base_batch': _k(1024, int, 'global batch at which lr, gating_lr, warmup_lr and min_lr apply'),
    'scale_lr': _k(True, bool, 'scale the learning rates linearly with global batch / lr_base_batch (not those in '
                   'absolute_lrs)'),
    'absolute_lrs': _k([], list, 'learning-rate keys used as given, never scaled by the batch rule: the ones set by '
                       '--lr, --gating-lr or --set (an lr the user types is the lr the run uses, as in timm)'),
    'sched': _k('cosine', str, 'timm decay schedule after the warm-up, stepped per update', ('cosine', 'tanh', 'poly')),
    'warmup_epochs': _k(5, int, 'linear warm-up epochs (Fig. 4: 5)'),
    'warmup_lr': _k(1e-6, float, 'learning rate at the start of the warm-up (at lr_base_batch)'),
    'min_lr': _k(1e-6, float, 'learning rate at the end of the cosine decay (at lr_base_batch)'),
    'clip_grad': _k(None, (float, NoneType), 'clip the gradient norm to this value (null: no clipping)'),
    'model_ema': _k(False, bool, 'keep an exponential moving average of the weights (timm ModelEmaV3)'),
    'model_ema_decay': _k(0.99996, float, 'EMA decay per update'),
    # runtime
    'device': _k('auto', str, 'auto (cuda if available), cpu, cuda or cuda:N'),
    'deterministic': _k(False, bool, 'bitwise-reproducible GPU runs (a resumed run equals the uninterrupted one): '
                        'no cuDNN autotuning, deterministic algorithms; slower (the CPU is deterministic anyway)'),
    'amp': _k('auto', str, 'mixed precision: auto (bf16 on GPU, none on CPU), bf16, fp16 or none',
              ('auto', 'bf16', 'fp16', 'none')),
    'channels_last': _k(None, (bool, NoneType), 'channels-last memory format (null: on GPU only)'),
    'compile': _k(False, (bool, str), f'torch.compile the model: false, true (= default) or a mode '
                  f'({", ".join(COMPILE_MODES)})'),
    'seed': _k(0, int, 'random seed (model init, data order, augmentation)'),
    'output': _k(None, (str, NoneType), 'run directory (null: runs/<recipe or model name>)'),
    'progress': _k(True, bool, 'show a progress bar per epoch'),
    # live dashboards (rank 0 only)
    'log': _k([], (list, str), 'live dashboards: tensorboard (OUTPUT/tensorboard), wandb, both, or none'),
    'log_every': _k(50, int, 'log the training loss, learning rates, gradient norm and throughput every N updates'),
    'wandb_project': _k(None, (str, NoneType), 'W&B project (null: $WANDB_PROJECT, else tcnn)'),
}

# Keys that must be > 0, >= 0, or in [0, 1].
_POSITIVE = ('epochs', 'batch_size', 'accum_steps', 'lr', 'gating_lr', 'lr_base_batch', 'img_size',
             'locality_strength', 'model_ema_decay', 'log_every')
_NON_NEGATIVE = ('workers', 'warmup_epochs', 'warmup_lr', 'min_lr', 'weight_decay', 'mixup', 'cutmix', 'recount',
                 'reparam_epoch', 'num_classes', 'eval_img_size', 'qk_dim', 'clip_grad')
_UNIT_INTERVAL = ('drop_path_rate', 'reprob', 'mixup_prob', 'mixup_switch_prob', 'smoothing', 'crop_pct')


def default_recipe() -> Dict[str, Any]:
    """The paper's shared fine-tuning settings (a fresh dict)."""
    return {k: (list(v.default) if isinstance(v.default, list) else v.default) for k, v in RECIPE_KEYS.items()}


def _unknown_key_error(key: str, where: str) -> TcnnError:
    matches = difflib.get_close_matches(key, RECIPE_KEYS, n=3, cutoff=0.6)
    hint = f' (did you mean {" or ".join(matches)}?)' if matches else ''
    return TcnnError(f'unknown recipe key {key!r} in {where}{hint}; keys are listed in docs/train.md')


def _coerce(key: str, value: Any, where: str) -> Any:
    """Check ``value`` against the schema of ``key``; ints become floats and numeric strings numbers where a number
    is expected (PyYAML reads ``1e-4`` as a string)."""
    spec = RECIPE_KEYS[key]
    if float in spec.types and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if float in spec.types and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if int in spec.types and isinstance(value, float) and value.is_integer() and float not in spec.types:
        value = int(value)
    ok = any(isinstance(value, t) and not (t is int and isinstance(value, bool)) for t in spec.types)
    if ok and isinstance(value, float) and not math.isfinite(value):
        raise TcnnError(f'recipe key {key!r} in {where} must be a finite number, got {value!r}')
    if ok and isinstance(value, list) and any(isinstance(v, float) and not math.isfinite(v) for v in value):
        raise TcnnError(f'recipe key {key!r} in {where} must hold finite numbers, got {value!r}')
    if not ok:
        names = ' or '.join('null' if t is NoneType else t.__name__ for t in spec.types)
        raise TcnnError(f'recipe key {key!r} in {where} must be {names}, got {value!r}')
    if spec.choices is not None and value not in spec.choices:
        choices = ', '.join('null' if c is None else str(c) for c in spec.choices)
        raise TcnnError(f'recipe key {key!r} in {where} must be one of {choices}, got {value!r}')
    return value


BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'recipes')


def bundled_recipes() -> List[str]:
    """Names of the recipes shipped with the package (``tcnn/train/recipes/*.yaml``, also ``recipes/`` in the repo)."""
    return sorted(f[:-5] for f in os.listdir(BUNDLED_DIR) if f.endswith('.yaml') and f != 'base.yaml')


def find_recipe(name_or_path: str) -> str:
    """A recipe path: an existing file, else a bundled recipe by name (``t_resnet50_rs`` or ``t_resnet50_rs.yaml``),
    so that ``--recipe t_resnet50_rs`` works from any folder after ``pip install``."""
    if os.path.isfile(name_or_path) or os.sep in name_or_path:
        return name_or_path
    name = name_or_path[:-5] if name_or_path.endswith('.yaml') else name_or_path
    bundled = os.path.join(BUNDLED_DIR, f'{name}.yaml')
    if os.path.isfile(bundled):
        return bundled
    raise TcnnError(f'recipe {name_or_path!r} is neither a file nor a bundled recipe '
                    f'({", ".join(bundled_recipes())})')


def load_recipe(path: str, _seen: Optional[List[str]] = None) -> Dict[str, Any]:
    """Read a recipe YAML file (following its ``base`` chain) into a dict of checked keys (not merged with the
    defaults). ``path`` may also name a bundled recipe (see ``find_recipe``)."""
    path = os.path.abspath(find_recipe(path) if _seen is None else path)
    seen = list(_seen or [])
    if path in seen:
        raise TcnnError(f'recipe {path} includes itself through "{BASE_KEY}"')
    if not os.path.isfile(path):
        raise TcnnError(f'recipe file not found: {path}')
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise TcnnError(f'cannot parse recipe {path}: {str(e).splitlines()[0]}') from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise TcnnError(f'recipe {path} must be a mapping of key: value, got {type(data).__name__}')
    recipe: Dict[str, Any] = {}
    base = data.pop(BASE_KEY, None)
    if base is not None:
        recipe.update(load_recipe(os.path.join(os.path.dirname(path), str(base)), seen + [path]))
    for key, value in data.items():
        if key not in RECIPE_KEYS:
            raise _unknown_key_error(str(key), path)
        recipe[key] = _coerce(key, value, path)
    return recipe


def parse_set(items: Iterable[str]) -> Dict[str, Any]:
    """``['lr=3e-4', 'stages=[3, 4]']`` -> ``{'lr': 3e-4, 'stages': [3, 4]}`` (values are read as YAML)."""
    out = {}
    for item in items:
        key, sep, raw = item.partition('=')
        key = key.strip().replace('-', '_')
        if not sep or not key:
            raise TcnnError(f'--set expects KEY=VALUE, got {item!r}')
        if key not in RECIPE_KEYS:
            raise _unknown_key_error(key, '--set')
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            raise TcnnError(f'--set {key}: cannot read value {raw!r}') from None
        out[key] = _coerce(key, value, '--set')
    return out


def apply_overrides(recipe: Dict[str, Any], overrides: Mapping[str, Any], where: str = 'the command line') -> None:
    """Check and apply ``overrides`` to ``recipe`` in place."""
    for key, value in overrides.items():
        if key not in RECIPE_KEYS:
            raise _unknown_key_error(key, where)
        recipe[key] = _coerce(key, value, where)


def validate_recipe(recipe: Dict[str, Any]) -> Dict[str, Any]:
    """Check ranges and combinations of a full recipe; returns it."""
    for key in recipe:
        if key not in RECIPE_KEYS:
            raise _unknown_key_error(key, 'the recipe')
    for key in _POSITIVE:
        if recipe[key] is not None and recipe[key] <= 0:
            raise TcnnError(f'recipe key {key!r} must be > 0, got {recipe[key]!r}')
    for key in _NON_NEGATIVE:
        if recipe[key] is not None and recipe[key] < 0:
            raise TcnnError(f'recipe key {key!r} must be >= 0, got {recipe[key]!r}')
    for key in _UNIT_INTERVAL:
        if recipe[key] is not None and not 0 <= recipe[key] <= 1:
            raise TcnnError(f'recipe key {key!r} must be in [0, 1], got {recipe[key]!r}')
    if recipe['reparam_epoch'] is not None:
        if recipe['no_sa']:
            raise TcnnError('reparam_epoch (late reparameterisation) and no_sa (no self-attention) exclude each other')
        if recipe['reparam_epoch'] >= recipe['epochs']:
            raise TcnnError(f'reparam_epoch {recipe["reparam_epoch"]} must be smaller than epochs '
                            f'{recipe["epochs"]} (it is the number of CNN epochs before the conversion)')
    if recipe['warmup_epochs'] >= recipe['epochs']:
        raise TcnnError(f'warmup_epochs {recipe["warmup_epochs"]} must be smaller than epochs {recipe["epochs"]} '
                        '(the decay follows the warm-up): set a shorter one with --set warmup_epochs=N')
    wrong = [k for k in recipe['absolute_lrs'] if k not in LR_KEYS]
    if wrong or len(set(recipe['absolute_lrs'])) != len(recipe['absolute_lrs']):
        raise TcnnError(f'recipe key \'absolute_lrs\' lists learning-rate keys ({", ".join(LR_KEYS)}) once each, got '
                        f'{recipe["absolute_lrs"]!r}')
    mixing = recipe['mixup'] > 0 or recipe['cutmix'] > 0
    if mixing and recipe['mixup_prob'] > 0 and recipe['batch_size'] % 2:
        raise TcnnError(f'mixup/cutmix need an even batch_size, got {recipe["batch_size"]}')
    lo_hi = recipe.get('scale')
    if lo_hi is not None and (len(lo_hi) != 2 or not all(isinstance(v, (int, float)) for v in lo_hi) or
                              not 0 < lo_hi[0] <= lo_hi[1] <= 1):
        raise TcnnError(f'recipe key \'scale\' must be [low, high] with 0 < low <= high <= 1, got {lo_hi!r}')
    for key in ('mean', 'std'):
        if recipe[key] is not None and (len(recipe[key]) != 3 or
                                        not all(isinstance(v, (int, float)) for v in recipe[key])):
            raise TcnnError(f'recipe key {key!r} must be a list of 3 numbers, got {recipe[key]!r}')
    if recipe['device'] not in ('auto', 'cpu', 'cuda') and not recipe['device'].startswith('cuda:'):
        raise TcnnError(f'device must be auto, cpu, cuda or cuda:N, got {recipe["device"]!r}')
    recipe['log'] = _log_backends(recipe['log'])
    recipe['compile'] = compile_mode(recipe['compile']) or False  # true (older recipes, checkpoints): 'default'
    return recipe


def _log_backends(value: Any) -> List[str]:
    """The ``log`` key as a list of distinct backends in ``LOG_BACKENDS`` order (``none``: no dashboard)."""
    names = [value] if isinstance(value, str) else list(value)
    bad = [n for n in names if n not in LOG_BACKENDS + ('none',)]
    if bad:
        raise TcnnError(f'recipe key \'log\' takes {", ".join(LOG_BACKENDS)} or none, got {bad[0]!r}')
    return [n for n in LOG_BACKENDS if n in names]


def resolve_recipe(
        path: Optional[str] = None,
        flags: Optional[Mapping[str, Any]] = None,
        sets: Iterable[str] = (),
        notes: Optional[List[str]] = None,
) -> Dict[str, Any]:
    """Defaults <- recipe file <- named flags <- ``--set`` items, validated. Learning rates given by flags or
    ``--set`` join ``absolute_lrs``. Adjustments the resolution made (a shortened warm-up) are appended to ``notes``
    as one-line messages."""
    recipe = default_recipe()
    if path:
        recipe.update(load_recipe(path))
    planned = dict(recipe)
    set_items = parse_set(sets)
    apply_overrides(recipe, flags or {})
    apply_overrides(recipe, set_items, '--set')
    mark_absolute_lrs(recipe, [*(flags or {}), *set_items])
    explicit = 'warmup_epochs' in (flags or {}) or 'warmup_epochs' in set_items
    note = fit_warmup(recipe, planned, explicit)
    if note and notes is not None:
        notes.append(note)
    return validate_recipe(recipe)


def fit_warmup(recipe: Dict[str, Any], planned: Mapping[str, Any], explicit: bool) -> Optional[str]:
    """A run shortened below the recipe's warm-up (``--epochs 2`` with the paper's 5-epoch warm-up) keeps the
    recipe's warm-up fraction instead of failing, as a timm user trying things expects; returns the notice, or None.

    Only when the warm-up comes from the recipe: a warm-up the user set explicitly is never changed (an impossible one
    fails in ``validate_recipe``, naming the fix).
    """
    epochs, warmup = recipe['epochs'], recipe['warmup_epochs']
    if explicit or warmup < epochs or epochs >= planned['epochs'] or not isinstance(epochs, int) or epochs <= 0:
        return None
    fitted = min(epochs - 1, math.floor(planned['warmup_epochs'] * epochs / planned['epochs'] + 0.5))
    recipe['warmup_epochs'] = fitted
    return (f'warm-up shortened from {warmup} to {fitted} epochs for a {epochs}-epoch run (the recipe warms up '
            f'{planned["warmup_epochs"]} of {planned["epochs"]} epochs); choose another with --set warmup_epochs=N')


def mark_absolute_lrs(recipe: Dict[str, Any], given: Iterable[str]) -> None:
    """Add the learning-rate keys among ``given`` (the keys a user set by flag or ``--set``) to the recipe's
    ``absolute_lrs``: timm's rule, the batch scaling applies to a recipe's learning rates only, never to one the user
    typed (``--lr 1e-3`` trains at 1e-3 whatever the batch)."""
    listed = recipe['absolute_lrs']
    given = set(given) | set(listed)
    # a listed key that is no learning rate stays, for validate_recipe to name it
    recipe['absolute_lrs'] = [k for k in LR_KEYS if k in given] + [k for k in listed if k not in LR_KEYS]


def dump_recipe(recipe: Mapping[str, Any]) -> str:
    """YAML text of a recipe, keys in schema order (readable back by ``load_recipe``)."""
    ordered = {k: recipe[k] for k in RECIPE_KEYS if k in recipe}
    return yaml.safe_dump(ordered, sort_keys=False, default_flow_style=None)


def scaled_lrs(recipe: Mapping[str, Any], global_batch: int) -> Dict[str, float]:
    """The batch-size rule: every learning rate of the recipe (lr, gating_lr, warmup_lr, min_lr) is multiplied by
    ``global_batch / lr_base_batch`` when ``scale_lr`` is on, so both peaks keep their 1000:1 ratio; those listed in
    ``absolute_lrs`` (given by the user) are used as they are."""
    factor = global_batch / recipe['lr_base_batch'] if recipe['scale_lr'] else 1.0
    absolute = set(recipe.get('absolute_lrs') or ())
    return {'factor': factor, **{k: recipe[k] if k in absolute else recipe[k] * factor for k in LR_KEYS}}


def auto_workers(local_processes: int = 1, cap: int = 8) -> int:
    """Data-loading workers per training process when the recipe says ``workers: null``: the CPUs this process may
    use, shared by the training processes of this machine, one left for the training process itself, at most
    ``cap`` (more rarely help and each holds a copy of the dataset's file list)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(0, min(cap, cpus // max(local_processes, 1) - 1))
