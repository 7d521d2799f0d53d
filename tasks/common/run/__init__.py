"""What a run leaves behind and says: where its files go, its own folder (one process per run id),
``run_summary.json``, its closing line, its predictions and the data it had to skip.

- ``outputs``: where a run's files go: its folder, the results folder, the result files written there
- ``folder``: a run's own folder, settled before ``rescale fit`` starts (one process per run id)
- ``summary``: ``run_summary.json``: what a run ended with, read by ``rescale compare`` and the studies
- ``report``: the one line every ``rescale fit|validate|test|predict`` ends with
- ``predictions``: what ``rescale predict`` writes, the same way for every task
- ``data_report``: what the data pipeline had to skip, logged and reported at the end
"""
from .outputs import (ResultFile, ResultsFolder, SaveConfigToRun, checkpoint_results_folder, note_result_file,
                      result_files, results_folder, run_directory)
from .folder import (check_run_outputs, claim_run_folder, evaluation_checkpoint, keep_csv_history,
                     refuse_starting_over, resume_point, run_folder, shown_path)
from .summary import (SUMMARY_FILE, MalformedSummary, RunSummary, find_summaries, higher_is_better,
                      read_summary)
from .report import evaluation_report, fit_report, next_command, written_files
from .predictions import (PREDICTIONS_FILE, TOP_K, PredictedSamples, class_predictions_csv, class_rows,
                          kept_samples, output_names, predict_dataset, sample_path, stage_dataset, top_classes,
                          write_result)
from .data_report import PROBLEMS_FILE, SkippedDataReport, problems_line, unread_line

__all__ = ["ResultFile", "ResultsFolder", "SaveConfigToRun", "note_result_file", "result_files",
           "results_folder", "checkpoint_results_folder", "run_directory", "check_run_outputs", "claim_run_folder",
           "evaluation_checkpoint", "keep_csv_history", "refuse_starting_over", "resume_point",
           "run_folder", "shown_path", "SUMMARY_FILE", "MalformedSummary", "RunSummary", "find_summaries",
           "higher_is_better", "read_summary", "evaluation_report", "fit_report", "next_command",
           "written_files", "PREDICTIONS_FILE", "TOP_K", "PredictedSamples", "class_predictions_csv",
           "class_rows", "kept_samples", "output_names", "predict_dataset", "sample_path", "stage_dataset", "top_classes",
           "write_result", "PROBLEMS_FILE", "SkippedDataReport", "problems_line", "unread_line"]
