"""The campaign's modules: the files each run mutates, the test files that own them, and the environment of every run.

A module's owning tests are those that check the promises of its files; mutmut runs a mutant against the owning tests
that called its function. Never change the owning tests of a run in progress (docs/tests.md, "Time"): mutmut's config
fingerprint includes its test selection, and a changed selection drops every result.
"""
from typing import Dict, List, Tuple

# module -> (files mutated, test files that own them, extra pytest arguments)
MODULES: Dict[str, Tuple[List[str], List[str], List[str]]] = {
    'integrity': (['tcnn/files/integrity.py'], ['tests/test_integrity.py'], []),
    'optim': (['tcnn/train/optim.py'], ['tests/test_optim.py'], []),
    # less the resumed training runs of earlier releases (18 s a mutant): test_the_recipe_of_an_earlier_releases_
    # checkpoint_loads reads the same recipes without training
    'recipe': (['tcnn/train/recipe.py'], ['tests/test_recipe.py'], ['-k', 'not run_resumes']),
    # the T-CNN file tests (saving, loading, safetensors, training checkpoints); test_detection.py's test of saving a
    # detector built by hand owns the torchvision detection and segmentation models' part (_dense_source,
    # _check_rebuilds, _settings, _builder_example), which the file tests do not call; test_timm_models.py's refusal
    # of a fused T-CNN owns model_to_dict's message for it; test_grouped.py's test of match_grouped_storage (moved here
    # from the layer) owns it
    'tcnn_file': (['tcnn/files/tcnn_file.py'], ['tests/test_file_saving.py', 'tests/test_file_loading.py',
                                              'tests/test_safetensors_files.py', 'tests/test_checkpoint_files.py',
                                              'tests/test_integrity.py',
                                              'tests/test_detection.py::test_save_records_how_to_rebuild',
                                              'tests/test_grouped.py::test_dense_stored_grouped_filters_rebuild_'
                                              'exactly_those_layers_dense',
                                              'tests/test_timm_models.py::test_a_fused_t_cnn_is_refused_by_save_with_'
                                              'the_fix'], []),
    # TorchScript cannot compile mutmut's trampolines (``*args``): the layers run with PYTORCH_JIT=0 (``jit.script``
    # returns the module itself, so the scripting tests compare eager with eager), less the tests that read a
    # TorchScript graph or count dynamo's graph breaks, which mutmut's trampolines add. Less, too, test_grouped.py's
    # whole-model tests (LATER: about 70% of the four files' time, run by every survivor of GPSA's forward); the run's
    # survivors are then checked against them (``check-later``), so their kills still count
    'layers': (['tcnn/layers/*'], ['tests/test_gpsa.py', 'tests/test_kept_values.py', 'tests/test_geometry.py',
                                  'tests/test_precision.py', 'tests/test_depthwise.py', 'tests/test_grouped.py'],
               ['-k', 'not softplus_without_beta and not without_graph_breaks and not models_are_exact and not '
                      'models_train and not dense_grouped_filters_loads_dense and not name_their_arguments']),
    # test_timm_models.py's fusion tests own fusion.py's RepVGG / MobileOne blocks (timm.utils.reparameterize_model),
    # which test_convert.py does not build: the two smallest models (float32) and the refusal to save a fused model;
    # test_bad_inputs.py owns the refusals of bad arguments (reparameterize's, check_equivalence's; 12 s in all)
    'convert': (['tcnn/convert/*'], ['tests/test_convert.py', 'tests/test_stages.py', 'tests/test_bad_inputs.py', *(
        f'tests/test_timm_models.py::test_timm_reparameterize_model_keeps_the_function_and_the_gpsa_layers[{name}]'
        for name in ('t_repvgg_a0', 't_mobileone_s0')),
        'tests/test_timm_models.py::test_a_fused_t_cnn_is_refused_by_save_with_the_fix'], []),
    # tcnn eval's suites, scoring and tables (test_eval.py), the model card (test_hf.py), the figures
    # (test_plots.py; test_analysis.py: the command) and their refusals of bad arguments (test_bad_inputs.py)
    'evaluation': (['tcnn/evaluation/*'], ['tests/test_eval.py', 'tests/test_plots.py', 'tests/test_hf.py',
                                          'tests/test_analysis.py', 'tests/test_bad_inputs.py'], []),
    # the data pipeline below the batched augmentation: folders and bad images, the readers (webdataset), the
    # encoded and resident pipelines and their decoding, the finishing thread, the data config (of timm and
    # torchvision models: test_data_config.py), the image folders of `tcnn analyze` and `tcnn inspect`
    # (test_images.py), the Hugging Face datasets (test_train_hfds.py)
    'data': ([f'tcnn/data/{name}.py' for name in ('config', 'images', 'decode', 'prefetch', 'folders', 'readers',
                                                  'resident', 'encoded')],
             ['tests/test_data_pipeline.py', 'tests/test_data.py', 'tests/test_train_wds.py',
              'tests/test_data_config.py', 'tests/test_images.py', 'tests/test_train_hfds.py',
              'tests/test_train_reliability.py::test_bad_images_stop_the_run_or_are_skipped_and_logged'], []),
    # the batched augmentation (timm's recipe on whole batches, on the CPU or the device): the crop and flip draws,
    # RandAugment's ops and sampling, the geometry, colour and erasing ops; each owning test compares with timm's or
    # Pillow's own op (tests/augmentation.py)
    'augment': ([f'tcnn/data/{name}.py' for name in ('batch_augment', 'rand_augment', 'batch_geometry', 'batch_colour',
                                                     'batch_misc')],
                ['tests/test_batch_augment.py', 'tests/test_rand_augment.py', 'tests/test_batch_geometry.py',
                 'tests/test_batch_colour.py', 'tests/test_batch_misc.py'], []),
    # glibc malloc's tuning for the training programs
    'allocator': (['tcnn/allocator.py'], ['tests/test_allocator.py'], []),
    # the training loop and its run (the recipe and the optimiser are campaigns of their own): what it prints
    # (test_train_report.py), where it starts (test_train_resume.py), training, resuming and preemption
    # (test_train.py, test_train_reliability.py) and its logs (test_dashboards.py)
    'train': ([f'tcnn/train/{name}.py' for name in ('engine', 'trainer', 'data', 'builders', 'resume', 'distributed',
                                                    'launch', 'dashboards', 'report', 'args')],
              ['tests/test_train_report.py', 'tests/test_train_resume.py', 'tests/test_train.py',
               'tests/test_train_reliability.py', 'tests/test_dashboards.py'], []),
    # the exports (ONNX, torch.export, AOTInductor, ExecuTorch, OpenVINO, Core ML) and their checks against the eager
    # model; each format's test skips, saying why, where its extra is not installed
    'export': (['tcnn/export/*'], ['tests/test_export.py', 'tests/test_export_aoti.py', 'tests/test_export_openvino.py',
                                   'tests/test_export_coreml.py'], []),
    # the files around a T-CNN file (tcnn_file and integrity are campaigns of their own): the Hub folder (test_hf.py,
    # test_hub.py: timm's own loaders), the sources a model is read from and their refusals (test_file_loading.py,
    # test_cli_convert.py, test_torch_hub.py), the weights, the run folder, the safetensors header (test_info.py)
    'files': ([f'tcnn/files/{name}.py' for name in ('hub_folder', 'sources', 'weights', 'loading', 'run_folder',
                                                    'safetensors_header')],
              ['tests/test_hf.py', 'tests/test_hub.py', 'tests/test_file_loading.py', 'tests/test_cli_convert.py',
               'tests/test_torch_hub.py', 'tests/test_info.py'], []),
    # what the attention heads learned (distances, centres, figures) and `tcnn analyze`
    'analysis': (['tcnn/analysis/*'], ['tests/test_analysis.py'], []),
    # `tcnn demo`: its plan, pools, runs, judgement and report, the synthetic data and the embedded reference
    'demo': (['tcnn/demo/*'], ['tests/test_demo.py', 'tests/test_demo_dynamics.py', 'tests/test_demo_record.py',
                               'tests/test_synthetic.py'], []),
}
# module -> owning tests left out of mutmut's run for their time, run on its survivors only (``check-later``)
LATER: Dict[str, List[str]] = {
    'layers': ['tests/test_grouped.py::test_grouped_and_depthwise_models_are_exact',
               'tests/test_grouped.py::test_grouped_and_depthwise_models_train',
               'tests/test_grouped.py::test_file_with_dense_grouped_filters_loads_dense'],
}
# environment of every run: offline (no test downloads), TorchScript off (see 'layers')
ENV = {'HF_HUB_OFFLINE': '1', 'PYTORCH_JIT': '0'}
