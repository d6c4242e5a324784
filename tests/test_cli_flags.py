"""The flags that several ``tcnn`` commands share mean the same in each (issue 48): one definition each in
``tcnn.commands.arguments`` (``--out``, ``--use-ema``, ``--img-size``, ``--device``; ``tcnn train``'s ``--device``
from the same help), one parser of ``--img-size`` (``tcnn train``'s too, which takes square sizes only), one
``--amp`` (``tcnn.runtime.precision``: ``tcnn train`` and ``tcnn eval``), one way to read the model a command
names."""
import argparse
from typing import Dict

import pytest
import timm
import torch

import tcnn
from tcnn.cli import COMMANDS, build_parser, main
from tcnn.commands.arguments import IMG_SIZE_HELP, USE_EMA_HELP, input_size, load_model, parse_img_size
from tcnn.errors import TcnnError
from tcnn.runtime.devices import DEVICE_HELP
from tcnn.runtime.precision import AMP_HELP, AMP_MODES
from tcnn.train.args import flag_overrides
from tcnn.train.recipe import Recipe

SHARED = ('--out', '--use-ema', '--img-size', '--device', '--amp')


def _flags(command: str) -> Dict[str, argparse.Action]:
    """The options of ``tcnn COMMAND``, by every spelling."""
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {opt: action for action in sub.choices[command]._actions for opt in action.option_strings}


def _having(flag: str) -> Dict[str, argparse.Action]:
    return {command: flags[flag] for command in COMMANDS for flags in [_flags(command)] if flag in flags}


def _shape(action: argparse.Action) -> tuple:
    """What a flag takes and gives, whatever its help: the same for one meaning."""
    return (type(action).__name__, tuple(action.option_strings), action.dest, action.type, action.nargs, action.const,
            action.choices)


def test_every_shared_flag_is_defined_once():
    having = {flag: _having(flag) for flag in SHARED}
    assert set(having['--out']) == {'demo', 'convert', 'inspect', 'plot', 'eval', 'publish', 'export'}
    assert set(having['--use-ema']) == {'convert', 'info', 'inspect', 'eval'}
    assert set(having['--img-size']) == {'convert', 'train', 'inspect', 'eval', 'export'}
    assert set(having['--device']) == {'demo', 'train', 'inspect', 'eval'}
    assert set(having['--amp']) == {'train', 'eval'}
    for flag, actions in having.items():  # tcnn train's recipe flags too
        shapes = {command: _shape(action) for command, action in actions.items()}
        assert len(set(shapes.values())) == 1, (flag, shapes)


def test_out_means_the_same_in_every_command():
    for command, action in _having('--out').items():
        assert action.option_strings == ['--out', '-o'] and action.default is None, command  # the help says it
        assert action.metavar == ('DIR' if 'folder' in action.help else 'OUT'), (command, action.help)


def test_use_ema_means_the_same_in_every_command():
    for command, action in _having('--use-ema').items():
        assert (action.help, action.default, action.const) == (USE_EMA_HELP, False, True), command


def test_img_size_is_parsed_one_way_in_every_command():
    for command, action in _having('--img-size').items():
        assert action.type is None and action.metavar == 'SIZE' and action.default is None, command
        if command == 'train':  # a recipe key: the side of the square training images
            assert 'N, or HxW with H = W' in action.help and 'recipe key img_size' in action.help
            continue
        assert action.help.startswith(IMG_SIZE_HELP + ' of '), (command, action.help)
    assert [parse_img_size(t) for t in (None, '224', '160x192', '160X192', '160,192', '64x64')] == [
        None, 224, (160, 192), (160, 192), (160, 192), 64]
    for text, message in (('big', 'takes N or HxW'), ('8x', 'takes N or HxW'), ('1x2x3', 'takes N or HxW'),
                          ('0', 'must be >= 1, got 0'), ('-5', 'must be >= 1, got -5'), ('64x0', 'must be >= 1')):
        with pytest.raises(TcnnError, match=message):
            parse_img_size(text)
    gray = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3))
    assert input_size(None, gray) is None
    assert input_size(64, gray) == (1, 64, 64) and input_size((64, 80), gray) == (1, 64, 80)


def _train_args(argv) -> argparse.Namespace:
    parser = build_parser('train')
    return parser.parse_args(['train', *argv])


def test_train_img_size_is_read_by_the_same_parser_and_square(tmp_path, capsys):
    assert flag_overrides(_train_args(['--img-size', '64']))['img_size'] == 64
    assert flag_overrides(_train_args(['--img-size', '64x64']))['img_size'] == 64
    for text, message in (('big', 'takes N or HxW'), ('0', 'must be >= 1, got 0')):  # parse_img_size's own lines
        with pytest.raises(TcnnError, match=message):
            flag_overrides(_train_args(['--img-size', text]))
    assert main(['train', '--img-size', '160x192', '--output', str(tmp_path / 'run'), '--print-config']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ['tcnn train: error: --img-size 160x192: tcnn train trains on square images (N or NxN, e.g. '
                   '--img-size 192); HxW is for the commands that read a model (tcnn eval --img-size 160x192)'], err
    assert main(['train', '--img-size', '96x96', '--print-config']) == 0
    assert 'img_size: 96' in capsys.readouterr().out.splitlines()


def test_amp_has_one_meaning():
    """``--amp [MODE]`` of tcnn train and tcnn eval: the same modes and help, a bare ``--amp`` is bf16 in both; each
    command states its default (train: its recipe's, auto; eval: none, the float32 of the tables)."""
    actions = _having('--amp')
    for command, action in actions.items():
        assert (action.nargs, action.const, action.choices) == ('?', 'bf16', AMP_MODES), command
        assert action.help.startswith(AMP_HELP), (command, action.help)
    assert {c: a.default for c, a in actions.items()} == {'train': None, 'eval': 'none'}
    assert Recipe().amp == 'auto'
    assert _train_args(['--amp']).amp == 'bf16'


def test_eval_amp_fp16_on_the_cpu_is_one_line(tmp_path, capsys):
    argv = ['eval', 'm.pt', '--suite', 'imagenet', '--data', str(tmp_path), '--device', 'cpu', '--amp', 'fp16']
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ['tcnn eval: error: amp fp16 needs a GPU (use bf16 or none on CPU)'], err


def test_device_means_the_same_in_every_command_each_with_its_default():
    defaults = {}
    for command, action in _having('--device').items():
        assert action.metavar == 'DEVICE' and action.help.startswith(DEVICE_HELP), (command, action.help)
        defaults[command] = action.default
    # train's default is its recipe's; demo's is the CPU its documented numbers were measured on
    assert defaults == {'train': None, 'eval': 'auto', 'inspect': 'auto', 'demo': 'cpu'}
    assert Recipe().device == 'auto'


@pytest.mark.parametrize('command', ['eval', 'inspect', 'demo'])
def test_device_errors_are_one_line(command, tmp_path, capsys):
    argv = {'eval': ['eval', 'm.pt', '--suite', 'imagenet', '--data', str(tmp_path)],
            'inspect': ['inspect', 'm.pt', '--out', str(tmp_path / 'out')],
            'demo': ['demo', '--out', str(tmp_path / 'demo')]}[command]
    assert main(argv + ['--device', 'tpu']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device 'tpu' is not a device" in err[0], err
    assert not (tmp_path / 'out').exists() and not (tmp_path / 'demo').exists()


def test_commands_read_a_named_model_one_way(tmp_path):
    """tcnn eval, inspect and export read the model a user names with one helper: a file (tcnn.load, its EMA weights
    with --use-ema) or a Hub folder, a missing or empty file one line; a model name only where names are allowed."""
    torch.manual_seed(0)
    cnn = timm.create_model('resnet10t', num_classes=3).eval()
    path = tcnn.save(cnn, str(tmp_path / 'cnn.pt'))
    loaded = load_model(path)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert not loaded.training and torch.equal(loaded(x), cnn(x))
    with pytest.raises(TcnnError, match='holds no EMA weights'):
        load_model(path, use_ema=True)
    (tmp_path / 'empty.pt').write_bytes(b'')
    for spec, what, message in ((str(tmp_path / 'missing.pt'), 'model file', 'model file not found'),
                                (str(tmp_path / 'empty.pt'), 'T-CNN file', 'T-CNN file .* is empty'),
                                (str(tmp_path), 'model file', 'folder without config.json'),
                                (f'local-dir:{tmp_path / "nowhere"}', 'model file', 'Hub folder not found'),
                                ('resnet18d', 'model file', 'model file not found: resnet18d')):
        with pytest.raises(TcnnError, match=message):
            load_model(spec, what)
    with pytest.raises(TcnnError, match='resnet18d is a model name'):
        load_model('resnet18d', use_ema=True, names=True)


def test_train_help_is_the_same_for_the_cli_and_the_module(capsys, monkeypatch):
    """``tcnn train --help`` and ``python -m tcnn.train --help`` list the same arguments with the same help, every
    named recipe flag among them."""
    from tcnn.train import launch
    from tcnn.train.args import FLAGS
    monkeypatch.setenv('COLUMNS', '120')
    with pytest.raises(SystemExit):
        main(['train', '--help'])
    cli_help = capsys.readouterr().out
    with pytest.raises(SystemExit):
        launch.main(['--help'])
    module_help = capsys.readouterr().out

    def options(text: str) -> str:  # from --recipe's help on: the usage lines and descriptions differ by design
        return ' '.join(text[text.index('\n  --recipe YAML'):].split())
    assert options(cli_help) == options(module_help)
    for flag, key, _ in FLAGS + (('--recipe', '', {}), ('--resume', '', {}), ('--set', '', {}),
                                 ('--print-config', '', {})):
        assert flag in cli_help and (not key or f'(recipe key {key})' in options(cli_help)), flag
    assert 'recipe overrides' in cli_help
    args = launch.argparse.ArgumentParser()
    launch.add_arguments(args)
    parsed = vars(args.parse_args(['--epochs', '3', '--no-pretrained', '--set', 'mixup=0', '--amp']))
    assert parsed['epochs'] == 3 and parsed['pretrained'] is False and parsed['set_items'] == ['mixup=0']
    assert parsed['amp'] == 'bf16' and parsed['lr'] is None
