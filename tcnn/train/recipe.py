"""Fine-tuning recipes: the typed ``Recipe``, its defaults (the paper's shared settings), YAML files and overrides.

A recipe is a ``Recipe``: one typed field per key, so that a misspelt key is an error where it is made (an unknown
key in a YAML file or ``--set`` names the closest keys; ``recipe.lrr`` in code is an AttributeError). A numeric key's
range is part of its field (``bound``) and is checked whenever a recipe is made: ``Recipe(epochs=-1)`` fails as a YAML
file with ``epochs: -1`` does. Frozen, a recipe holds tuples where a file holds lists. Its defaults
are the shared fine-tuning settings of T-CNN (arXiv:2106.05795, section 3): 50 epochs, AdamW, global batch 1024, lr
1e-4 after a 5-epoch warm-up then cosine decay, gating lr 0.1, DeiT augmentation. YAML files, ``--set key=value``,
``config.yaml`` and a checkpoint's ``'config'`` spell the keys as the field names; ``Recipe.to_dict`` is the plain
form that files and other tools (timm, W&B, TensorBoard) get.

A YAML file may name a ``base`` file (relative to itself) whose keys it extends. Precedence, lowest first: defaults,
base file, recipe file, named command-line flags (``--lr``), ``--set key=value``. The learning rates of the defaults
and of recipe files are given at the reference batch ``lr_base_batch`` and scaled with the run's global batch; one
given on the command line is absolute (``absolute_lrs``, timm's rule).
"""
import dataclasses
import difflib
import math
import os
import typing
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import yaml

from ..errors import TcnnError
from ..runtime.compiling import COMPILE_MODES, compile_mode
from ..runtime.precision import AMP_HELP, AMP_MODES

__all__ = ['Recipe', 'RecipeKey', 'RECIPE_KEYS', 'LR_KEYS', 'LOG_BACKENDS', 'PIPELINES', 'POSITIVE', 'NON_NEGATIVE',
           'UNIT_INTERVAL', 'load_recipe', 'parse_set', 'apply_overrides', 'validate_recipe', 'resolve_recipe',
           'fit_warmup', 'mark_absolute_lrs', 'dump_recipe', 'scaled_lrs', 'auto_workers']

# The learning rates the batch rule scales (``scaled_lrs``), unless the user gave them (``absolute_lrs``).
LR_KEYS = ('lr', 'gating_lr', 'warmup_lr', 'min_lr')

# Where a run decodes and augments its images (tcnn.train.data.resolve_pipeline chooses for 'auto').
PIPELINES = ('auto', 'pil', 'device', 'resident')

# Live dashboards of `tcnn train --log` (tcnn.train.dashboards), each an optional extra of the same name.
LOG_BACKENDS = ('tensorboard', 'wandb')
BASE_KEY = 'base'  # names a parent recipe file; resolved while loading, never part of the resolved recipe
NoneType = type(None)

# The ranges a numeric key may be bounded to, as its error message states them (a field's ``bound``)
POSITIVE = '> 0'
NON_NEGATIVE = '>= 0'
UNIT_INTERVAL = 'in [0, 1]'


def _key(default: Any, help_text: str, choices: Optional[Tuple[Any, ...]] = None,
         accepts: Optional[Tuple[type, ...]] = None, bound: Optional[str] = None) -> Any:
    """A ``Recipe`` field: its default, its help line (``tcnn train --help``, docs/train.md), the values it may take
    (``choices``), where a file or ``--set`` may spell it otherwise than the field's type, the types it accepts
    (``log: wandb`` for ``[wandb]``), and the range of a number (``bound``: ``POSITIVE``, ``NON_NEGATIVE`` or
    ``UNIT_INTERVAL``; None is always allowed where the field is optional). A list default is stored as a tuple."""
    metadata = {'help': help_text, 'choices': choices, 'accepts': accepts, 'bound': bound}
    return dataclasses.field(default=tuple(default) if isinstance(default, list) else default, metadata=metadata)


def _within(value: Any, bound: str) -> bool:
    """``value`` lies in ``bound`` (one of ``POSITIVE``, ``NON_NEGATIVE``, ``UNIT_INTERVAL``)."""
    if bound == POSITIVE:
        return value > 0
    if bound == NON_NEGATIVE:
        return value >= 0
    return 0 <= value <= 1


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A ``tcnn train`` recipe: every key, typed, with the paper's defaults (T-CNN section 3, Table 1).

    Frozen: a run's recipe changes only through ``apply_overrides`` (checked like ``--set``) or
    ``dataclasses.replace``. Build one from plain keys with ``Recipe.from_dict``; ``to_dict`` gives them back. Every
    recipe made, whatever made it, holds its keys' ranges (``bound``: a one-line ``TcnnError`` otherwise) and tuples
    where its keys are lists in a file; the checks that combine keys are ``validate_recipe``'s.
    """
    # model and conversion
    model: str = _key('resnet50d', 'source CNN: a timm name (resnetrs50, resnet50d, ...) or torchvision:NAME')
    pretrained: bool = _key(True, "start from the library's pretrained weights (false: random init)")
    weights: Optional[str] = _key(None, 'local checkpoint of the source CNN (instead of downloading)')
    num_classes: Optional[int] = _key(None, 'classifier size; null: the class count of the data (class folders, '
                                      'class names); set it for data that does not state it (webdataset labels), '
                                      'else it must agree', bound=NON_NEGATIVE)
    drop_path_rate: float = _key(0.0, 'stochastic depth rate (Table 1: 0.1 for RS-50/101, 0.2 for larger)',
                                 bound=UNIT_INTERVAL)
    no_sa: bool = _key(False, 'Table 1 "without SA" baseline: fine-tune the unconverted CNN')
    reparam_epoch: Optional[int] = _key(None, 'Table 3 late reparameterisation: train the CNN this many epochs, then '
                                        'convert and continue with the same optimiser (null: convert at the start)',
                                        bound=NON_NEGATIVE)
    stages: Union[int, str, Tuple[Any, ...], None] = _key(None, 'stages whose k x k convs become GPSA (null: the '
                                                          'default; see tcnn convert --list-stages MODEL)')
    locality_strength: float = _key(1.0, 'initial alpha of every head (paper: 1.0, on the verge of locality)',
                                    bound=POSITIVE)
    gating_init: float = _key(1.0, 'initial lambda of every head (paper: 1.0)')
    qk_dim: Optional[int] = _key(None, 'per-head query/key width (null: min(C_in // heads, C_in // groups))',
                                 bound=NON_NEGATIVE)
    # data
    data: Optional[str] = _key(None, 'dataset root in ImageFolder layout, with train/ and val/ class folders')
    train_split: str = _key('train', 'training sub-folder of the data root')
    val_split: str = _key('val', 'validation sub-folder of the data root')
    img_size: int = _key(224, 'fine-tuning resolution (Tables 1 and 5)', bound=POSITIVE)
    eval_img_size: Optional[int] = _key(None, 'evaluation resolution (null: img_size)', bound=NON_NEGATIVE)
    crop_pct: Optional[float] = _key(None, "evaluation centre-crop fraction (null: the model's default)",
                                     bound=UNIT_INTERVAL)
    interpolation: Optional[str] = _key('bicubic', "resize interpolation (null: the model's default)",
                                        ('bilinear', 'bicubic', 'nearest', 'random', None))
    mean: Optional[Tuple[float, ...]] = _key(None, "normalisation mean (null: the model's default)")
    std: Optional[Tuple[float, ...]] = _key(None, "normalisation std (null: the model's default)")
    workers: Optional[int] = _key(None, 'data-loading processes per training process (null: sized to the machine, '
                                  'the CPUs of this process shared by the local training processes, at most 8)',
                                  bound=NON_NEGATIVE)
    skip_bad_images: bool = _key(False, 'replace unreadable or truncated training/validation images by readable ones '
                                 '(logged once each) instead of stopping')
    pin_memory: bool = _key(True, 'pin host memory of batches (GPU only)')
    data_pipeline: str = _key('auto', 'where images are decoded and augmented: pil (timm\'s PIL transform, one image '
                              'at a time in the loader workers), device (workers read file bytes and draw each '
                              'sample\'s augmentation; a batch is decoded and augmented at once on the run\'s device: '
                              'nvjpeg on a GPU), resident (the splits decoded once into memory on the device, no '
                              'loader workers), auto (resident when the splits fit, else device; pil for streams and '
                              'for augmentation the batched path lacks); the run records the one it chose',
                              PIPELINES)
    # augmentation (DeiT)
    aa: Optional[str] = _key('rand-m9-mstd0.5-inc1', 'timm auto-augment policy (null: none)')
    color_jitter: float = _key(0.3, 'colour jitter (timm ignores it when a RandAugment policy is set)')
    scale: Tuple[float, ...] = _key([0.08, 1.0], 'area range of the random resized crop, as fractions of the image '
                                    '(timm/DeiT --scale; [1.0, 1.0]: the whole image, for labels that a crop can '
                                    'change)')
    reprob: float = _key(0.25, 'random erasing probability', bound=UNIT_INTERVAL)
    remode: str = _key('pixel', 'random erasing mode', ('pixel', 'rand', 'const'))
    recount: int = _key(1, 'random erasing count', bound=NON_NEGATIVE)
    mixup: float = _key(0.8, 'mixup alpha (0: off)', bound=NON_NEGATIVE)
    cutmix: float = _key(1.0, 'cutmix alpha (0: off)', bound=NON_NEGATIVE)
    mixup_prob: float = _key(1.0, 'probability of applying mixup or cutmix to a batch', bound=UNIT_INTERVAL)
    mixup_switch_prob: float = _key(0.5, 'probability of cutmix instead of mixup when both are on', bound=UNIT_INTERVAL)
    mixup_mode: str = _key('batch', 'mixup granularity', ('batch', 'pair', 'elem'))
    smoothing: float = _key(0.1, 'label smoothing', bound=UNIT_INTERVAL)
    # optimisation
    epochs: int = _key(50, 'fine-tuning epochs (SM C also reports 10 and 20)', bound=POSITIVE)
    batch_size: int = _key(128, 'batch per process (global batch = batch_size x processes x accum_steps)',
                           bound=POSITIVE)
    accum_steps: int = _key(1, 'micro-batches accumulated per optimiser update', bound=POSITIVE)
    opt: str = _key('adamw', 'timm optimiser name (the paper: AdamW; SGD was worse)')
    opt_eps: Optional[float] = _key(1e-8, 'optimiser epsilon (null: its default)')
    opt_betas: Optional[Tuple[float, ...]] = _key(None, 'optimiser betas (null: its default)')
    momentum: float = _key(0.9, 'momentum of SGD-like optimisers')
    weight_decay: float = _key(0.05, 'weight decay of weights (not of norms, biases, positional or gating params)',
                               bound=NON_NEGATIVE)
    lr: float = _key(1e-4, 'peak learning rate at the reference global batch lr_base_batch (given by --lr or --set: '
                     'as is)', bound=POSITIVE)
    gating_lr: float = _key(0.1, 'peak learning rate of the gating parameters at lr_base_batch (given: as is)',
                            bound=POSITIVE)
    lr_base_batch: int = _key(1024, 'global batch at which lr, gating_lr, warmup_lr and min_lr apply', bound=POSITIVE)
    scale_lr: bool = _key(True, 'scale the learning rates linearly with global batch / lr_base_batch (not those in '
                          'absolute_lrs)')
    absolute_lrs: Tuple[str, ...] = _key([], 'learning-rate keys used as given, never scaled by the batch rule: the '
                                         'ones set by --lr, --gating-lr or --set (an lr the user types is the lr the '
                                         'run uses, as in timm)')
    sched: str = _key('cosine', 'timm decay schedule after the warm-up, stepped per update', ('cosine', 'tanh', 'poly'))
    warmup_epochs: int = _key(5, 'linear warm-up epochs (Fig. 4: 5)', bound=NON_NEGATIVE)
    warmup_lr: float = _key(1e-6, 'learning rate at the start of the warm-up (at lr_base_batch)', bound=NON_NEGATIVE)
    min_lr: float = _key(1e-6, 'learning rate at the end of the cosine decay (at lr_base_batch)', bound=NON_NEGATIVE)
    clip_grad: Optional[float] = _key(None, 'clip the gradient norm to this value (null: no clipping)',
                                      bound=NON_NEGATIVE)
    model_ema: bool = _key(False, 'keep an exponential moving average of the weights (timm ModelEmaV3)')
    model_ema_decay: float = _key(0.99996, 'EMA decay per update', bound=POSITIVE)
    # runtime
    device: str = _key('auto', 'auto (cuda if available), cpu, cuda or cuda:N')
    deterministic: bool = _key(False, 'bitwise-reproducible GPU runs (a resumed run equals the uninterrupted one): '
                               'no cuDNN autotuning, deterministic algorithms; slower (the CPU is deterministic '
                               'anyway)')
    amp: str = _key('auto', AMP_HELP, AMP_MODES)
    channels_last: Optional[bool] = _key(None, 'channels-last memory format (null: on GPU only)')
    # False, or a torch.compile mode: validate_recipe turns true (a bare --compile, older recipes) into 'default'
    compile: Union[bool, str] = _key(False, f'torch.compile the model: false, true (= default) or a mode '
                                     f'({", ".join(COMPILE_MODES)})')
    seed: int = _key(0, 'random seed (model init, data order, augmentation)')
    output: Optional[str] = _key(None, 'run directory (null: runs/<recipe or model name>)')
    progress: bool = _key(True, 'show a progress bar per epoch')
    # live dashboards (rank 0 only); a file or --set may name one as a string, validate_recipe makes it a tuple
    log: Tuple[str, ...] = _key([], 'live dashboards: tensorboard (OUTPUT/tensorboard), wandb, both, or none',
                                accepts=(list, str))
    log_every: int = _key(50, 'log the training loss, learning rates, gradient norm and throughput every N updates',
                          bound=POSITIVE)
    wandb_project: Optional[str] = _key(None, 'W&B project (null: $WANDB_PROJECT, else tcnn)')

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = 'the recipe', base: Optional['Recipe'] = None,
                  validate: bool = True) -> 'Recipe':
        """A recipe from plain keys (a YAML file's, a checkpoint's ``'config'``) over ``base`` (default: the
        defaults); keys left out keep ``base``'s values.

        Args:
            data: Keys and values, spelt as the fields.
            where: Where they come from, for the error messages.
            base: The recipe they override.
            validate: Check the combinations of keys (``validate_recipe``) too; each key's range is checked anyway.

        Raises:
            TcnnError: An unknown key (naming the closest ones), a value of the wrong type or out of its range, or
                (``validate``) an impossible combination.
        """
        recipe = apply_overrides(base if base is not None else cls(), data, where)
        return validate_recipe(recipe) if validate else recipe

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, list):  # frozen means immutable all the way down: no list a caller could change
                value = tuple(value)
                object.__setattr__(self, field.name, value)  # dataclasses' own way to set a frozen field
            bound = field.metadata['bound']
            if bound is not None and value is not None and not _within(value, bound):
                raise TcnnError(f'recipe key {field.name!r} must be {bound}, got {value!r}')

    def to_dict(self) -> Dict[str, Any]:
        """Every key and its value as plain YAML/JSON values, in field order: what ``config.yaml``, a checkpoint's
        ``'config'`` and the dashboards' hyperparameters hold."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _plain(value: Any) -> Any:
    """``value`` as files and other tools hold it: a tuple (or list) as a list."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


@dataclasses.dataclass(frozen=True)
class RecipeKey:
    """Schema of one recipe key, read off its ``Recipe`` field, as files, flags and ``--set`` spell it: a key the
    recipe holds as a tuple is a list here (``default``, ``types``)."""
    default: Any
    types: Tuple[type, ...]
    help: str
    choices: Optional[Tuple[Any, ...]] = None
    bound: Optional[str] = None  # POSITIVE, NON_NEGATIVE, UNIT_INTERVAL or None


def _runtime_types(annotation: Any) -> Tuple[type, ...]:
    """``Optional[Tuple[float, ...]]`` -> ``(list, NoneType)``: the types a file's value of a field may have (a
    sequence is a list in YAML)."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) is Union else (annotation,)
    types = (typing.get_origin(a) or a for a in args)
    return tuple(list if t is tuple else t for t in types)


def _schema(field: 'dataclasses.Field') -> RecipeKey:
    types = field.metadata['accepts'] or _runtime_types(field.type)
    return RecipeKey(_plain(field.default), types, field.metadata['help'], field.metadata['choices'],
                     field.metadata['bound'])


RECIPE_KEYS: Dict[str, RecipeKey] = {f.name: _schema(f) for f in dataclasses.fields(Recipe)}


def _unknown_key_error(key: str, where: str) -> TcnnError:
    matches = difflib.get_close_matches(key, RECIPE_KEYS, n=3, cutoff=0.6)
    hint = f' (did you mean {" or ".join(matches)}?)' if matches else ''
    return TcnnError(f'unknown recipe key {key!r} in {where}{hint}; keys are listed in docs/train.md')


def _coerce(key: str, value: Any, where: str) -> Any:
    """Check ``value`` against the schema of ``key``; ints become floats and numeric strings numbers where a number
    is expected (PyYAML reads ``1e-4`` as a string)."""
    spec = RECIPE_KEYS[key]
    if isinstance(value, tuple) and list in spec.types:  # a recipe's own value, given back in code
        value = list(value)
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


def apply_overrides(recipe: Recipe, overrides: Mapping[str, Any], where: str = 'the command line') -> Recipe:
    """``recipe`` with ``overrides`` (keys spelt as its fields) checked and applied: a new recipe."""
    values = {}
    for key, value in overrides.items():
        if key not in RECIPE_KEYS:
            raise _unknown_key_error(str(key), where)
        values[key] = _coerce(key, value, where)
    return dataclasses.replace(recipe, **values)


def validate_recipe(recipe: Recipe) -> Recipe:
    """Check the combinations of a recipe's keys and the form of its sequences (each key's range is checked when a
    recipe is made); returns it with ``log`` as a tuple of backends and ``compile`` as False or a mode. Values appear
    in messages as a file spells them (lists)."""
    r = recipe
    if r.reparam_epoch is not None:
        if r.no_sa:
            raise TcnnError('reparam_epoch (late reparameterisation) and no_sa (no self-attention) exclude each other')
        if r.reparam_epoch >= r.epochs:
            raise TcnnError(f'reparam_epoch {r.reparam_epoch} must be smaller than epochs {r.epochs} (it is the '
                            'number of CNN epochs before the conversion)')
    if r.warmup_epochs >= r.epochs:
        raise TcnnError(f'warmup_epochs {r.warmup_epochs} must be smaller than epochs {r.epochs} (the decay follows '
                        'the warm-up): set a shorter one with --set warmup_epochs=N')
    wrong = [k for k in r.absolute_lrs if k not in LR_KEYS]
    if wrong or len(set(r.absolute_lrs)) != len(r.absolute_lrs):
        raise TcnnError(f'recipe key \'absolute_lrs\' lists learning-rate keys ({", ".join(LR_KEYS)}) once each, got '
                        f'{_plain(r.absolute_lrs)!r}')
    mixing = r.mixup > 0 or r.cutmix > 0
    if mixing and r.mixup_prob > 0 and r.batch_size % 2:
        raise TcnnError(f'mixup/cutmix need an even batch_size, got {r.batch_size}')
    lo_hi = r.scale
    if lo_hi is not None and (len(lo_hi) != 2 or not all(isinstance(v, (int, float)) for v in lo_hi) or
                              not 0 < lo_hi[0] <= lo_hi[1] <= 1):
        raise TcnnError(f'recipe key \'scale\' must be [low, high] with 0 < low <= high <= 1, got {_plain(lo_hi)!r}')
    for key in ('mean', 'std'):
        value = getattr(r, key)
        if value is not None and (len(value) != 3 or not all(isinstance(v, (int, float)) for v in value)):
            raise TcnnError(f'recipe key {key!r} must be a list of 3 numbers, got {_plain(value)!r}')
    if r.device not in ('auto', 'cpu', 'cuda') and not r.device.startswith('cuda:'):
        raise TcnnError(f'device must be auto, cpu, cuda or cuda:N, got {r.device!r}')
    # compile true (older recipes, checkpoints): 'default'
    return dataclasses.replace(r, log=_log_backends(r.log), compile=compile_mode(r.compile) or False)


def _log_backends(value: Any) -> Tuple[str, ...]:
    """The ``log`` key as distinct backends in ``LOG_BACKENDS`` order (``none``: no dashboard)."""
    names = [value] if isinstance(value, str) else list(value)
    bad = [n for n in names if n not in LOG_BACKENDS + ('none',)]
    if bad:
        raise TcnnError(f'recipe key \'log\' takes {", ".join(LOG_BACKENDS)} or none, got {bad[0]!r}')
    return tuple(n for n in LOG_BACKENDS if n in names)


def resolve_recipe(
        path: Optional[str] = None,
        flags: Optional[Mapping[str, Any]] = None,
        sets: Iterable[str] = (),
        notes: Optional[List[str]] = None,
) -> Recipe:
    """Defaults <- recipe file <- named flags <- ``--set`` items, validated. Learning rates given by flags or
    ``--set`` join ``absolute_lrs``. Adjustments the resolution made (a shortened warm-up) are appended to ``notes``
    as one-line messages."""
    planned = Recipe.from_dict(load_recipe(path), path, validate=False) if path else Recipe()
    set_items = parse_set(sets)
    recipe = apply_overrides(planned, flags or {})
    recipe = apply_overrides(recipe, set_items, '--set')
    recipe = mark_absolute_lrs(recipe, [*(flags or {}), *set_items])
    explicit = 'warmup_epochs' in (flags or {}) or 'warmup_epochs' in set_items
    recipe, note = fit_warmup(recipe, planned, explicit)
    if note and notes is not None:
        notes.append(note)
    return validate_recipe(recipe)


def fit_warmup(recipe: Recipe, planned: Recipe, explicit: bool) -> Tuple[Recipe, Optional[str]]:
    """A run shortened below the recipe's warm-up (``--epochs 2`` with the paper's 5-epoch warm-up) keeps the
    recipe's warm-up fraction instead of failing, as a timm user trying things expects; returns the recipe and the
    notice (None when nothing changed).

    Only when the warm-up comes from the recipe: a warm-up the user set explicitly is never changed (an impossible one
    fails in ``validate_recipe``, naming the fix).
    """
    epochs, warmup = recipe.epochs, recipe.warmup_epochs
    if explicit or warmup < epochs or epochs >= planned.epochs or not isinstance(epochs, int):
        return recipe, None
    fitted = min(epochs - 1, math.floor(planned.warmup_epochs * epochs / planned.epochs + 0.5))
    return dataclasses.replace(recipe, warmup_epochs=fitted), (
        f'warm-up shortened from {warmup} to {fitted} epochs for a {epochs}-epoch run (the recipe warms up '
        f'{planned.warmup_epochs} of {planned.epochs} epochs); choose another with --set warmup_epochs=N')


def mark_absolute_lrs(recipe: Recipe, given: Iterable[str]) -> Recipe:
    """``recipe`` with the learning-rate keys among ``given`` (the keys a user set by flag or ``--set``) added to its
    ``absolute_lrs``: timm's rule, the batch scaling applies to a recipe's learning rates only, never to one the user
    typed (``--lr 1e-3`` trains at 1e-3 whatever the batch)."""
    listed = recipe.absolute_lrs
    given = set(given) | set(listed)
    # a listed key that is no learning rate stays, for validate_recipe to name it
    return dataclasses.replace(recipe, absolute_lrs=tuple(k for k in LR_KEYS if k in given) +
                               tuple(k for k in listed if k not in LR_KEYS))


def dump_recipe(recipe: Union[Recipe, Mapping[str, Any]]) -> str:
    """YAML text of a recipe, keys in field order (readable back by ``load_recipe``). A mapping (a checkpoint's
    ``'config'``, as the model card shows it) keeps only the keys a recipe has."""
    values = recipe.to_dict() if isinstance(recipe, Recipe) else recipe
    ordered = {k: values[k] for k in RECIPE_KEYS if k in values}
    return yaml.safe_dump(ordered, sort_keys=False, default_flow_style=None)


def scaled_lrs(recipe: Recipe, global_batch: int) -> Dict[str, float]:
    """The batch-size rule: every learning rate of the recipe (lr, gating_lr, warmup_lr, min_lr) is multiplied by
    ``global_batch / lr_base_batch`` when ``scale_lr`` is on, so both peaks keep their 1000:1 ratio; those listed in
    ``absolute_lrs`` (given by the user) are used as they are."""
    factor = global_batch / recipe.lr_base_batch if recipe.scale_lr else 1.0
    absolute = set(recipe.absolute_lrs)
    return {'factor': factor, **{k: getattr(recipe, k) if k in absolute else getattr(recipe, k) * factor
                                 for k in LR_KEYS}}


def auto_workers(local_processes: int = 1, cap: int = 8) -> int:
    """Data-loading workers per training process when the recipe says ``workers: null``: the CPUs this process may
    use, shared by the training processes of this machine, one left for the training process itself, at most
    ``cap`` (more rarely help and each holds a copy of the dataset's file list)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(0, min(cap, cpus // max(local_processes, 1) - 1))
