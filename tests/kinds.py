"""What each test compares against, counted per kind of reference.

    python tests/kinds.py          # a table: tests (as pytest counts them) per kind

A test's kind is its `@pytest.mark.reference(kind)` marker (on the test or its module) if it
has one, else the entry for its file and function in REGISTRY below (the file's default, then
the functions that differ). Kinds, from strongest to weakest:

- independent: the expected value shares nothing with the code: a float64 numpy formula, a
  hand-computed number or count, a published number, another program's output, a property
  checked exactly (causality, a multiset of tokens).
- two_paths: two paths of this package must agree (resumed vs uninterrupted, sharded vs one
  device, scanned vs per-layer, a kernel vs the package's own float64 XLA reference).
- error_message: bad input is refused with the expected message.
- smoke: it runs (exit 0, finite numbers, a substring in compiled text, a file exists).
- golden: output equals strings or values written into the test (commands, names, layouts).
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

KINDS = ("independent", "two_paths", "error_message", "smoke", "golden")

# file (without .py): (default kind, {test function: kind} for the tests that differ)
REGISTRY: dict[str, tuple[str, dict[str, str]]] = {
    "test_analysis": ("independent", {
        "test_bad_input_is_named": "error_message",
        "test_read_metrics_and_plots": "smoke",
        "test_analyze_keeps_an_earlier_steps_analysis": "golden"}),
    "test_attention_layer": ("independent", {
        "test_gate_parameter_shapes_follow_score_shapes": "golden",
        "test_switch_v_1top1_equals_g2_headwise_with_the_same_weights": "two_paths"}),
    "test_bad_input": ("error_message", {}),
    "test_benchmarks": ("smoke", {
        "test_check_small_values_and_gradients_match_reference": "two_paths",
        "test_dry_run_prints_the_gpu_commands_inside_the_budget": "golden",
        "test_check_retries_a_case_that_fails_with_small_tiles": "golden",
        "test_packed_rows_count_each_document_not_the_whole_row": "independent",
        "test_xla_is_not_timed_at_16k_and_triton_mha_not_with_gqa": "golden"}),
    "test_beyond_variants": ("independent", {
        "test_two_sigmoid_zero_init_is_the_ungated_layer_at_init": "two_paths",
        "test_bias_starts_at_its_init_value": "golden",
        "test_windowed_chunked_gradients_match_reference": "two_paths",
        "test_an_implementation_without_windows_names_those_with_them": "error_message",
        "test_bad_combinations_raise_naming_the_field": "error_message",
        "test_gate_input_wider_than_the_model_is_refused": "error_message"}),
    "test_chunked_attention": ("two_paths", {
        "test_memory_stays_linear_in_length": "independent",
        "test_bad_arguments_are_refused": "error_message"}),
    "test_chunked_loss": ("independent", {
        "test_reported_parts_match_the_plain_loss": "two_paths",
        "test_train_loss_and_gradients_match_the_plain_loss": "two_paths",
        "test_bad_chunk_sizes_are_refused_naming_the_field": "error_message",
        "test_paper_recipes_chunk_the_loss": "golden"}),
    "test_compiled_step": ("smoke", {
        "test_extrapolated_flops_and_bytes_match_the_whole_compile": "two_paths"}),
    "test_config": ("error_message", {"test_default_configs_validate": "smoke"}),
    "test_configs": ("error_message", {
        "test_config_file_validates_with_its_defaults": "smoke",
        "test_paper_recipes": "independent"}),
    "test_data": ("independent", {
        "test_train_iterator_resumes_exactly_and_reshuffles_each_epoch": "two_paths",
        "test_sentencepiece_trains_once_then_comes_from_cache": "golden"}),
    "test_data_hf": ("golden", {
        "test_bad_tokenizer_settings_are_one_line_config_errors": "error_message"}),
    "test_data_sources": ("independent", {
        "test_every_source_gives_the_same_token_stream": "two_paths",
        "test_array_record_batches_resume_exactly_mid_shard": "two_paths",
        "test_bad_sources_are_one_line_errors_naming_the_field": "error_message",
        "test_tfds_inputs_with_concat_rows": "two_paths"}),
    "test_data_train": ("two_paths", {
        "test_the_epoch_guard_refuses_before_compiling": "error_message",
        "test_a_run_on_a_tfds_dataset": "smoke"}),
    "test_data_walkthrough": ("smoke", {}),
    "test_docs": ("smoke", {
        "test_block_reader_sees_indented_blocks_and_info_strings": "independent",
        "test_numbers_beside_runnable_blocks_are_what_they_print": "golden",
        "test_the_path_check_finds_planted_paths_outside_the_repository": "independent",
        "test_texts_name_no_path_outside_the_repository": "golden"}),
    "test_durations": ("independent", {}),  # hand-built measurements, the rule by hand
    "test_errors": ("error_message", {"test_every_user_error_class_is_a_user_error": "golden"}),
    "test_evaluate_length": ("golden", {
        "test_perplexity_at_the_training_length_is_the_analysis_perplexity": "two_paths",
        "test_task_scores_come_from_the_predictions_at_the_answer": "independent",
        "test_bad_arguments_are_refused_before_anything_is_written": "error_message"}),
    "test_eviction": ("independent", {
        "test_window_without_kept_tokens_is_sliding_window_attention": "two_paths",
        "test_generation_with_a_big_enough_window_is_unchanged": "two_paths",
        "test_bad_eviction_settings_name_the_field": "error_message",
        "test_eviction_eval_refuses_bad_windows_before_loading": "error_message"}),
    "test_faults": ("two_paths", {
        "test_the_fingerprint_is_the_written_out_checksum_on_host_and_device": "independent",
        "test_the_fingerprint_of_8_byte_values_is_the_same_on_host_and_device": "independent",
        "test_damaged_checkpoints_are_reported_moved_aside_and_skipped": "golden",
        "test_checkpoints_verify_what_they_read_and_never_hold_non_finite_values":
            "error_message",
        "test_a_second_ctrl_c_exits_at_once": "golden",
        "test_stop_mode_ends_at_the_first_bad_step_with_finite_checkpoints": "golden",
        "test_skip_mode_drops_bad_updates_and_finishes_finite": "golden",
        "test_a_diverging_learning_rate_stops_after_max_skipped": "error_message",
        "test_a_live_run_holds_its_workdir_and_a_stale_lock_is_taken_over": "error_message"}),
    "test_first_hour": ("golden", {
        "test_the_python_example_of_the_docs_defines_every_name_it_uses": "smoke",
        "test_the_inspect_notebook_finds_a_run_in_the_folder_make_demo_writes":
            "error_message"}),
    "test_flags": ("golden", {}),
    "test_flash_gate_backward": ("independent", {
        "test_forward_writes_the_ungated_output_only_when_the_backward_needs_it": "golden"}),
    "test_gate_live": ("smoke", {
        "test_scanned_and_per_layer_models": "two_paths",
        "test_every_attention_kernel_applies_the_fused_gate": "two_paths",
        "test_the_identity_gate_reproduces_the_ungated_model": "two_paths"}),
    "test_generate": ("two_paths", {
        "test_top_p_keeps_the_smallest_nucleus": "independent",
        "test_bad_arguments_are_refused": "error_message"}),
    "test_gpu_compile": ("smoke", {
        "test_every_gpu_row_of_the_tile_table_is_compiled_above": "golden",
        "test_a_tile_row_over_the_gpus_shared_memory_fails_to_compile": "error_message",
        "test_cudnn_is_refused_what_the_a100_cannot_do": "error_message",
        "test_segment_conversion_matches_a_hand_built_case": "independent",
        "test_packed_cudnn_refuses_what_it_cannot_serve": "error_message",
        "test_row_groups_cover_every_gpu_row": "golden"}),
    "test_gpu_preflight": ("independent", {
        "test_unknown_gpu_names_and_bad_hosts_are_refused_with_the_known_ones": "error_message",
        "test_cli_refuses_an_unknown_gpu_in_one_line_before_compiling": "error_message",
        "test_tiny_train_step_compiles_for_8_gpus_of_2_hosts_with_triton_kernels": "smoke",
        "test_gpu_report_dump_and_verdicts": "golden"}),
    "test_harness": ("independent", {
        "test_batch_and_bucket_change_nothing": "two_paths",
        "test_three_tasks_through_lm_evals_evaluator_and_its_files": "smoke",
        "test_bad_input_is_one_line_naming_the_flag_before_any_compile": "error_message",
        "test_bad_harness_fields_are_config_errors": "error_message",
        "test_training_hook_and_the_command_on_the_trained_run": "two_paths",
        "test_chat_template_renders_as_transformers_would": "golden"}),
    "test_harness_summary": ("independent", {
        "test_no_benchmark_section_without_scores": "golden"}),
    "test_grids": ("golden", {
        "test_every_grid_loads_at_every_scale": "smoke",
        "test_paper_grids_cover_every_table_row": "independent",
        "test_bad_names_are_refused": "error_message",
        "test_a_log_copy_appends_each_byte_once": "independent",
        "test_every_tiny_run_is_a_valid_config": "smoke"}),
    "test_hf": ("independent", {
        "test_round_trip_is_bit_exact_and_sharded_folders_load": "two_paths",
        "test_export_of_own_model_has_the_official_layout": "golden",
        "test_rope_scaling_mapping": "golden",
        "test_unsupported_config_fields_are_refused_in_one_line": "error_message",
        "test_bad_folders_are_refused_in_one_line": "error_message"}),
    "test_hf_convert": ("independent", {
        "test_continued_training_starts_from_the_imported_weights": "two_paths",
        "test_convert_refuses_before_writing": "error_message"}),
    "test_hf_qwen3_next": ("independent", {
        "test_round_trip_is_bit_exact": "two_paths",
        "test_export_refuses_what_a_layout_cannot_hold": "error_message",
        "test_what_the_model_cannot_reproduce_is_refused_in_one_line": "error_message",
        "test_an_mtp_head_in_the_weights_is_refused": "error_message",
        "test_the_new_model_fields_are_checked_in_one_line": "error_message"}),
    "test_init_from": ("two_paths", {
        "test_bad_sources_are_refused_before_anything_is_written": "error_message"}),
    "test_inspect": ("independent", {
        "test_cli_prints_json": "smoke",
        "test_cli_rejects_unknown_variant_with_allowed_names": "error_message"}),
    # StopRequest asked through a model of XLA's preemption sync (from its C++ source), the
    # stopping step worked out by hand; the control checks that model alone (it would stop
    # nothing if the loop asked with the run's step).
    "test_interrupts": ("independent", {}),
    "test_intervene": ("independent", {
        "test_scale_one_leaves_logits_bitwise_equal": "two_paths",
        "test_bad_interventions_name_the_flag": "error_message",
        "test_intervene_on_a_trained_run_writes_a_new_folder_and_changes_nothing": "two_paths"}),
    "test_layering": ("golden", {
        "test_cycle_finder_finds_a_planted_cycle": "independent",
        "test_import_reader_sees_lazy_and_relative_imports": "independent",
        "test_import_reader_counts_type_only_imports": "independent",
        "test_an_upward_import_fails_the_floor_check": "independent"}),
    "test_lr_sweep": ("golden", {
        "test_bad_multipliers_are_refused_naming_the_flag": "error_message"}),
    "test_model": ("independent", {
        "test_every_variant_runs_forward_and_backward_and_is_causal": "smoke",
        "test_packed_sequences_match_separate_sequences": "two_paths"}),
    "test_moe": ("independent", {
        "test_global_balance_is_the_same_for_any_split": "two_paths",
        "test_layer_balance_loss_is_global_on_a_data_parallel_mesh": "two_paths",
        "test_expert_parallel_matches_single_device": "two_paths",
        "test_tiny_moe_model_learns_and_reports_expert_load": "smoke",
        "test_bad_moe_fields_are_named_before_building": "error_message"}),
    "test_multihost": ("golden", {"test_two_processes_agree_with_one_process": "two_paths"}),
    "test_notebooks": ("smoke", {}),
    "test_ops_dispatch": ("golden", {"test_model_on_pallas_gpu_matches_xla": "two_paths"}),
    "test_optim": ("independent", {
        "test_weight_decay_skips_norms_vectors_and_gate_theta": "golden"}),
    "test_paired_stats": ("independent", {
        "test_significant_difference_needs_no_more_seeds": "golden"}),
    "test_pallas_gpu": ("two_paths", {
        "test_lowers_to_triton": "smoke", "test_bad_input_is_refused": "error_message"}),
    "test_pallas_sharded": ("two_paths", {
        "test_per_device_axes_divide_their_dimension": "independent"}),
    "test_pallas_splash": ("two_paths", {
        "test_compiles_for_tpu_generations": "smoke",
        "test_refuses_what_splash_cannot_do": "error_message",
        "test_tile_divides_the_padded_length": "independent"}),
    "test_pallas_tpu": ("two_paths", {
        "test_lowers_to_mosaic": "smoke",
        "test_training_configuration_compiles_for_a_tpu": "smoke",
        "test_compiles_for_tpu_generations": "smoke",
        "test_bad_input_is_refused": "error_message"}),
    "test_pallas_windows": ("two_paths", {
        "test_block_ranges_are_the_tiles_the_hand_built_window_mask_touches": "independent",
        "test_the_tpu_grid_is_shortened_to_the_blocks_a_window_can_touch": "independent",
        "test_unmasked_tiles_lie_wholly_inside_the_window": "independent",
        "test_cost_estimate_counts_only_the_pairs_inside_the_window": "independent",
        "test_window_is_refused_with_the_implementations_that_serve_it": "error_message",
        "test_auto_takes_a_pallas_kernel_for_a_window_where_it_is_the_first_that_serves_it":
            "golden",
        "test_windowed_kernel_compiles_for_a_tpu_forward_and_backward": "smoke",
        "test_windowed_kernel_compiles_for_an_h200_forward_and_backward": "smoke"}),
    "test_passkey_training": ("independent", {
        "test_passkey_source_serves_each_host_its_rows_of_the_global_batch": "two_paths",
        "test_a_passkey_run_trains_is_scored_at_length_and_bad_fields_are_named": "independent"}),
    "test_paths": ("golden", {}),
    "test_platform_choice": ("smoke", {
        "test_a_process_wide_target_traces_once_for_it": "error_message",
        "test_the_same_function_interprets_on_this_cpu_and_matches_float64": "independent",
        "test_kernels_cached_in_one_trace_serve_the_next": "independent"}),
    "test_plots": ("smoke", {}),
    "test_pod_shapes": ("independent", {
        "test_type_check_command_for_create": "error_message",
        "test_preflight_compiles_the_tiny_config_for_two_slices": "error_message"}),
    "test_preflight": ("independent", {
        "test_unknown_accelerator_names_are_refused_with_the_known_ones": "error_message",
        "test_cli_refuses_bad_input_in_one_line_before_compiling": "error_message",
        "test_report_dump_and_verdict": "golden"}),
    "test_progress_log": ("independent", {}),
    "test_ray_grid": ("two_paths", {
        "test_a_two_host_slice_runs_one_multi_process_job": "independent",
        "test_a_code_failure_is_reported_with_its_log_tail_and_not_retried": "error_message",
        "test_a_cancel_landing_while_the_trainer_starts_still_stops_it": "independent",
        "test_a_grid_cluster_of_its_own_runs_tasks_at_the_callers_priority": "independent",
        "test_hosts_of_several_slices_get_the_multislice_settings": "golden",
        "test_an_attempt_is_retried_only_when_a_host_was_lost_or_stopped_after_saving":
            "golden"}),
    "test_records": ("golden", {
        "test_tables_are_rebuilt_from_records_with_command_commit_and_seeds": "independent",
        "test_code_version_names_the_dirty_files_and_the_training_codes_trees": "independent"}),
    "test_reference_attention": ("independent", {
        "test_gqa_equals_mha_with_repeated_kv_heads": "two_paths",
        "test_packed_segments_do_not_attend_across_boundaries": "two_paths",
        "test_first_token_weights_equal_column_zero_of_probs": "two_paths",
        "test_large_logits_stay_finite": "smoke",
        "test_bad_arguments_name_the_field": "error_message",
        "test_cudnn_refuses_segments_instead_of_dropping_them": "error_message"}),
    "test_retrieval_tasks": ("independent", {
        "test_too_short_a_length_is_refused_with_the_task_name": "error_message"}),
    "test_rope": ("independent", {
        "test_base_change_equals_plain_rope_with_the_new_base": "two_paths",
        "test_factor_one_is_the_identity": "two_paths",
        "test_config_builds_the_scaling_and_rejects_bad_fields": "error_message"}),
    "test_run_checks": ("error_message", {
        "test_a_buildable_run_reports_its_training_tokens_as_sentencepiece_counts_them":
            "independent"}),
    "test_scan_layers": ("two_paths", {
        "test_paper_archs_scan_by_default_and_small_ones_do_not": "golden",
        "test_the_scanned_program_does_not_grow_with_depth": "independent"}),
    "test_seeds": ("two_paths", {"test_bad_telemetry_interval_names_the_field": "error_message"}),
    "test_seqio": ("two_paths", {
        "test_a_users_task_module_is_imported_and_brings_its_vocabulary": "error_message",
        "test_c4_task_registers_without_download": "smoke",
        "test_main_imports_the_seqio_module_before_validating": "error_message"}),
    "test_sharding": ("golden", {
        "test_mesh_shape_fills_one_axis_and_rejects_bad_sizes": "error_message",
        "test_per_device_parameter_bytes_shrink_by_fsdp_times_tensor": "independent",
        "test_sharded_loss_and_grads_equal_single_device": "two_paths",
        "test_checkpoint_saved_on_one_mesh_restores_on_others": "two_paths",
        "test_memory_plan_matches_hand_count": "independent"}),
    "test_sink_positions": ("independent", {}),  # float64 loops, hand cases, scipy
    "test_sinks": ("independent", {
        "test_batches_are_identical_after_resume_and_host_independent": "two_paths",
        "test_bad_task_settings_are_one_line_errors": "error_message",
        "test_sink_tiny_defaults_to_the_task": "golden",
        "test_sink_summary_of_a_two_row_grid": "golden"}),
    "test_table5": ("golden", {
        "test_every_scale_is_defined": "smoke",
        "test_the_pass_key_grid_trains_and_scores_pass_keys": "smoke"}),
    "test_telemetry": ("two_paths", {
        "test_a_run_writes_telemetry_and_its_record": "golden",
        "test_emergence_step_is_the_first_point_at_three_times_uniform": "independent"}),
    "test_tpu_scripts": ("golden", {
        "test_every_script_is_shellcheck_clean": "smoke",
        "test_every_script_names_a_missing_setting": "error_message",
        "test_scripts_refuse_bad_settings": "error_message",
        "test_scripts_refuse_bad_flags_and_a_missing_settings_file": "error_message",
        "test_every_script_answers_help": "smoke",
        "test_launch_refuses_when_the_real_preflight_fails": "error_message"}),
    "test_tokenizer_training": ("independent", {
        "test_a_sampled_tokenizer_is_the_same_model_in_every_process": "two_paths"}),
    "test_tpu_tiles": ("independent", {}),
    "test_train": ("two_paths", {
        "test_loss_decreases_within_a_few_dozen_steps": "smoke",
        "test_workdir_refuses_a_different_config_and_backs_up_on_overwrite": "error_message",
        "test_workdir_is_checked_by_every_process_before_the_primary_writes": "golden",
        "test_spike_rule": "independent",
        "test_data_files_in_a_bucket": "smoke",
        "test_micro_batched_eval_of_a_scanned_model_traces": "smoke"}),
    "test_train_command": ("golden", {}),
    "test_variants": ("error_message", {
        "test_every_paper_row_is_registered_under_its_table_name": "independent",
        "test_registry_fields": "golden",
        "test_gate_position_aliases": "golden"}),
    "test_watchdog": ("golden", {
        "test_a_negative_timeout_is_refused_in_one_line": "error_message"}),
}

UNCLASSIFIED = "unclassified"


def kind_of(module: str, function: str, marker_kind: str | None = None) -> str:
    """The kind of one test: its marker's, else the registry's, else "unclassified"."""
    if marker_kind is not None:
        if marker_kind not in KINDS:
            raise ValueError(f"reference({marker_kind!r}) is not a kind; choose one of "
                             f"{', '.join(KINDS)}")
        return marker_kind
    if module not in REGISTRY:
        return UNCLASSIFIED
    default, overrides = REGISTRY[module]
    return overrides.get(function, default)


class _Collector:
    """A pytest plugin that records each collected test's kind."""

    def __init__(self) -> None:
        self.kinds: collections.Counter[str] = collections.Counter()
        self.unclassified: list[str] = []

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            marker = item.get_closest_marker("reference")
            module = Path(str(item.fspath)).stem
            kind = kind_of(module, getattr(item, "originalname", item.name),
                           marker.args[0] if marker else None)
            self.kinds[kind] += 1
            if kind == UNCLASSIFIED:
                self.unclassified.append(item.nodeid)


def count(test_dir: Path) -> _Collector:
    import pytest

    collector = _Collector()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", str(test_dir)],
                       plugins=[collector])
    if code not in (0, 5):
        raise SystemExit(f"collecting the tests failed (pytest exit status {code})")
    return collector


def table(kinds: collections.Counter[str]) -> str:
    total = sum(kinds.values())
    lines = ["| kind of reference | tests | share |", "|---|---|---|"]
    for kind in (*KINDS, UNCLASSIFIED):
        if kinds[kind]:
            lines.append(f"| {kind} | {kinds[kind]} | {100 * kinds[kind] / total:.0f}% |")
    lines.append(f"| all | {total} | 100% |")
    return "\n".join(lines)


if __name__ == "__main__":
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # pytest's own collection listing
        result = count(Path(__file__).parent)
    print(table(result.kinds))
    for nodeid in result.unclassified:
        print("unclassified:", nodeid, file=sys.stderr)
