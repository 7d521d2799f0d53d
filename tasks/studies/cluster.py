"""The cluster engines: a study's grid (:mod:`.grid`) handed to a scheduler, each point running
``rescale study run-point <study_dir> <index>`` (:func:`.engines.run_one`), resumed from its
``last.ckpt`` when requeued.

- SLURM (:func:`write_slurm`): ``<study_dir>/slurm.sbatch``, a job array with one task per
  point (requeued on preemption).
- W&B sweep (:func:`write_sweep`): ``<study_dir>/sweep.yaml``, a grid sweep over the point
  index for ``wandb agent``.
"""
from __future__ import annotations

import os
import shlex
from typing import Any, Optional

import yaml

from ..common.errors import UserError
from ..common.system import atomic_open, write_atomically
from .grid import GRID_FILE, Grid, rescale_command

__all__ = ["write_slurm", "write_sweep", "check_slurm_options"]


def check_slurm_options(cpus_per_task: int, max_parallel: Optional[int]) -> None:
    """Refuse, in one line, what would make ``slurm.sbatch`` other than asked: a core count below 1,
    a ``--max_parallel`` below 1 (0 left the array unthrottled, a negative one is no SLURM array)."""
    if cpus_per_task < 1:
        raise UserError(f"--cpus_per_task {cpus_per_task}: give 1 or more")
    if max_parallel is not None and max_parallel < 1:
        raise UserError(f"--max_parallel {max_parallel}: give 1 or more (leave it out for no limit)")


def write_slurm(grid: Grid, partition: Optional[str] = None, gres: Optional[str] = "gpu:1",
                time_limit: str = "24:00:00", cpus_per_task: int = 8, max_parallel: Optional[int] = None,
                extra: tuple[str, ...] = (), job_name: Optional[str] = None) -> str:
    """``<study_dir>/slurm.sbatch``: one array task per grid point (task id = point index), each
    running or resuming its point on ``cpus_per_task`` cores (asked of the job and of its ``srun``
    step, which does not inherit them); SIGTERM two minutes before the time limit, requeued on
    preemption (143). Submitting it again only runs the points not done."""
    n = len(grid.points)
    if n == 0:
        raise UserError("the grid has no points: nothing to submit")
    check_slurm_options(cpus_per_task, max_parallel)
    os.makedirs(os.path.join(grid.study_dir, "slurm"), exist_ok=True)
    array = f"0-{n - 1}" + (f"%{max_parallel}" if max_parallel else "")
    lines = ["#!/bin/bash",
             f"# rescale study {grid.kind}: {n} grid points, one array task each ({GRID_FILE} lists them).",
             "# A task runs its point, or resumes it from last.ckpt; a point already done exits at once,",
             "# so the script can be submitted again to finish a study. Results: rescale study aggregate "
             + shlex.quote(grid.study_dir),
             f"#SBATCH --job-name={job_name or 'rescale-' + grid.kind}",
             f"#SBATCH --array={array}"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if gres:
        lines.append(f"#SBATCH --gres={gres}")
    lines += [f"#SBATCH --cpus-per-task={cpus_per_task}",
              f"#SBATCH --time={time_limit}",
              f"#SBATCH --output={os.path.join(grid.study_dir, 'slurm', '%A_%a.out')}",
              "#SBATCH --signal=TERM@120",
              "#SBATCH --requeue",
              "#SBATCH --open-mode=append"]
    lines += [f"#SBATCH {option}" for option in extra]
    lines += ["",
              f"cd {shlex.quote(grid.cwd)}",
              # since SLURM 22.05 a step does not inherit the job's --cpus-per-task: without it the
              # point (its data-loading workers too) would run on one core
              f"srun --cpus-per-task={cpus_per_task} {shlex.join(rescale_command())} study run-point "
              f"{shlex.quote(grid.study_dir)} "
              '"$SLURM_ARRAY_TASK_ID"',
              "status=$?",
              'if [ "$status" -eq 143 ]; then scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"; fi',
              'exit "$status"', ""]
    path = os.path.join(grid.study_dir, "slurm.sbatch")
    write_atomically(path, "\n".join(lines))
    os.chmod(path, 0o755)
    return path


def write_sweep(grid: Grid, project: Optional[str] = None) -> str:
    """``<study_dir>/sweep.yaml``: a W&B grid sweep over the point index. ``wandb agent`` runs
    ``rescale study run-point <study_dir> --point=<i>`` (``${args}`` expands to ``--point=<i>``),
    and the run joins the sweep through the agent's ``WANDB_RUN_ID``."""
    if not grid.points:
        raise UserError("the grid has no points: nothing to sweep")
    program, *rest = rescale_command()
    sweep: dict[str, Any] = {
        "name": f"rescale-study-{grid.kind}-{os.path.basename(grid.study_dir)}",
        "description": f"rescale study {grid.kind}: {len(grid.points)} grid points of {grid.path}",
        "program": program,
        "method": "grid",
        "parameters": {"point": {"values": list(range(len(grid.points)))}},
        "command": ["${env}", "${program}", *rest, "study", "run-point", grid.study_dir, "${args}"],
    }
    if project:
        sweep["project"] = project
    path = os.path.join(grid.study_dir, "sweep.yaml")
    with atomic_open(path) as f:
        f.write(f"# wandb sweep {shlex.quote(path)}; then wandb agent <entity>/<project>/<sweep id>\n")
        yaml.safe_dump(sweep, f, sort_keys=False)
    return path
