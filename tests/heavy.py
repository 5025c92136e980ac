"""Tests that ``make test`` leaves to ``make test-slow`` (CI runs both), by node id (fnmatch patterns).

Each took 2 s or more of its own (or of its module's set-up) on 2 cores, and a lighter test of the same code stays
in ``make test``: the kept representative is named beside each group. Tests whose module marks them ``slow``
themselves (fault injection, training through the service) are not listed here.
"""

from __future__ import annotations

HEAVY = (
    # browser: tests/test_ui_browser_status.py, test_ui_browser_analysis.py and test_ui_browser_forms.py stay
    "tests/test_ui_browser.py::*",
    "tests/test_compare_browser.py::*",
    "tests/test_tracin_breakdown_browser.py::*",  # the breakdown's numbers: tests/test_tracin_breakdown.py
    "tests/test_evaluation_browser.py::test_the_classifier_evaluation_pages_fit_a_phone*",  # the numbers: tests/test_classifier_evaluation_pages.py
    "tests/test_classifier_influence.py::test_the_influence_grid_and_the_text_list_in_a_browser*",  # GET /compare itself is tested in make test (tests/test_compare*.py)
    "tests/adversarial/test_dashboard.py::test_dashboard_pages_raise_no_csp_violation_in_a_browser",
    "tests/test_ui_browser_forms.py::test_no_sideways_scrolling_at_390px_on_the_jobs_list_and_the_forms",
    "tests/test_ui_browser_status.py::test_the_strip_says_no_worker_runs_on_every_page_without_overflow[[]1280]",
    "tests/test_ui_kinds.py::test_conve_training_page_curves_metrics_and_checkpoints",
    # model files read in the bounded parser: the ConvE config test of the same module stays
    "tests/adversarial/test_model_files.py::test_a_huge_classifier_config_is_413_naming_it",
    # fan-out quotas: the failed-shards and parent-quota tests stay
    "tests/adversarial/test_fanout_quota.py::test_a_worker_killed_between_a_shard_end_and_the_release_strands_nothing",
    "tests/adversarial/test_fanout_quota.py::test_an_owner_holds_at_most_the_window_on_the_bulk_queue",
    "tests/adversarial/test_fanout_quota.py::test_another_owners_small_job_starts_after_at_most_the_window_of_shards",
    "tests/adversarial/test_fanout_quota.py::test_cancel_during_planning_leaves_no_child_queued_deferred_or_pending",
    # whole-versus-sharded equality: the NRMS cases of test_attributions_contract.py and NAML's fixed steps stay
    "tests/test_attributions_contract.py::*[[]naml-compare-faithfulness]",
    "tests/test_fanout.py::test_a_sharded_naml_summary_equals_one_jobs_field_by_field[[]adaptive]",
    "tests/test_fanout.py::test_a_dataset_run_fans_out_over_two_workers_and_equals_one_job",
    "tests/test_fanout.py::test_an_interactive_request_overtakes_a_bulk_run",
    "tests/test_hf_attributions.py::test_whole_and_sharded_texts_runs_give_one_result",
    "tests/test_export_service.py::test_whole_and_sharded_image_runs_give_one_result",
    # the classifier LDS against a direct computation: its noise-ceiling, mislabel and 422 tests stay
    "tests/test_evaluate_classifier.py::test_lds_equals_the_direct_computation_on_the_same_subset_models",
    "tests/test_tracin_fanout.py::test_a_result_lists_its_first_entries_inline_and_every_one_in_results_jsonl",
    "tests/test_tracin_fanout.py::test_test_mode_sharded_equals_one_job*",
    "tests/test_tracin_fanout.py::test_single_mode_and_the_stored_feature_estimators_give_the_same_shape",
    # news IG: the NRMS and NAML demo cases stay; the MiniLM demo is built only for these
    "tests/test_news_ig.py::*nrms-minilm-demo*",
    "tests/test_news_ig.py::test_tolerance_defaults_to_nested_clenshaw_curtis_and_equals_a_fixed_run",
    "tests/test_news_ig.py::test_tolerance_with_gauss_legendre_starts_low_and_refines_per_sample",
    "tests/test_news_ig.py::test_word_stats_and_the_poisoned_comparison",
    "tests/test_byo_train_news.py::test_train_nrms_and_naml_then_explain",
    # these two use the models the test above trains
    "tests/test_byo_train_news.py::test_resume_refuses_another_model_configuration",
    "tests/test_byo_train_news.py::test_unlabelled_data_balanced_is_422_and_warned",
    # TracIn and TRAK: one streaming top-k case and the ent.weight ghost case stay
    "tests/test_tracin.py::test_streaming_top_k_equals_the_dense_scores[[]ghost-all-64-2]",
    "tests/test_tracin.py::test_streaming_top_k_equals_the_dense_scores[[]ghost-last-500-3]",
    "tests/test_tracin.py::test_streaming_top_k_equals_the_dense_scores[[]vmap-layers3-50-2]",
    "tests/test_tracin.py::test_ghost_equals_materialised_gradients[[]score_bce-all]",
    "tests/test_tracin.py::test_ghost_equals_materialised_gradients[[]train-*ent.weight:output*]",
    "tests/test_tracin.py::test_ghost_equals_materialised_gradients[[]score_bce-*bn2*]",
    # the cached test factors: the ghost method (the default) stays
    "tests/test_tracin.py::test_test_factors_are_reused_across_train_ranges_and_give_the_same_scores[[]vmap]",
    # IG completeness against an independent computation: the zero baseline stays
    "tests/test_news_ig.py::test_completeness_terms_against_an_independent_computation[[]pad]",
    "tests/test_trak.py::test_projection_is_unbiased_with_the_stated_relative_standard_deviation*",
    "tests/test_evaluation.py::test_trak_ensemble_is_trak_averaged_over_the_full_model_and_its_members",
    "tests/test_kg_model.py::test_report_modes_topk_and_csv",
    "tests/test_pykeen_interop.py::*",
    # Hugging Face import: distilbert, roberta and gpt2 stay
    "tests/test_hf_import.py::test_a_saved_classifier_imports_and_predicts_exactly_as_transformers[[]bert]",
    "tests/test_provenance.py::*[[]import_model]",
    # Vision-BDH training: resume without best, the short-batch compile fallback and a copied checkpoint stay
    "tests/test_vision_train.py::test_resume_continues_exactly",
    "tests/test_vision_train.py::test_resume_records_allowed_changes",
    "tests/test_vision_train.py::test_seeded_deterministic_runs_are_identical",
    "tests/test_vision_train.py::test_cancel_at_batch_end_keeps_last_checkpoint",
    "tests/test_vision_train.py::test_compile_failing_in_eval_mode_falls_back",
    "tests/test_vision_train.py::test_compile_fallback_in_training_repeats_the_batch_exactly",
    "tests/test_vision_service.py::test_train_digits_end_to_end",  # its bad requests' 422s stay
    "tests/test_vision_job.py::test_a_job_restarted_on_another_host_after_its_last_epoch_registers_and_succeeds",
    # LoRA ablation and probes: test_ablation_experiment's attn2 case and the API's demo run stay
    "tests/test_lora_probe.py::test_restores_best_epoch_when_val_accuracy_peaks_early",
    "tests/test_lora_splits.py::test_duplicates_without_class_signal_stay_at_chance",
    "tests/test_lora_data.py::test_format2_matches_format1",
    "tests/test_ablation_experiment.py::test_attn1_signal_recovered_in_both_layer_sets",
    "tests/test_ablation_experiment.py::test_paired_drop_over_repeated_splits",
    "tests/test_ablation_api.py::test_ablation_by_path_end_to_end",
    "tests/test_ablation_api.py::test_demo_dataset_registered_and_runs",
    # workers, stores and the backlog: the non-finite floats, the store clients' outage tests and the 32-shard backlog
    # test stay
    "tests/test_worker_faults.py::test_jobs_enqueued_before_an_upgrade_still_run_and_ignore_their_function_path",
    "tests/test_worker_faults.py::test_threads_and_nice_apply_to_the_worker_process",
    "tests/test_worker_faults.py::test_worker_logs_are_json_lines_naming_the_job",
    "tests/test_store_outage.py::test_a_real_s3_store_that_stops_or_hangs_fails_within_its_bounds",
    "tests/test_store_outage.py::test_a_job_fails_as_store_unavailable_and_the_service_says_the_store_is_down",
    "tests/test_backlog.py::test_the_backlog_counts_pending_shards_that_the_queue_does_not",
    "tests/test_plugin_example.py::test_a_worker_runs_the_plugin_job_and_its_result_renders",
    "tests/test_team.py::test_resume_from_accepts_only_the_callers_own_jobs",
)
