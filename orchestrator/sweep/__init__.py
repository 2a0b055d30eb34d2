"""`orch sweep`: many trials of one job, searched by Optuna, pruned and resumable (docs/sweeps.md).

One module per stage; callers (orchestrator.api) import the modules they need, so that reading a sweep file
(spec.py) imports neither Optuna nor torch:
- spec.py: sweep.yaml's models and every check made before a trial starts (`load_sweep`);
- study.py: the Optuna study (storage, sampler, pruner), and the trials as rows;
- owners.py: which `orch sweep` process runs which trial (two processes never run one trial);
- trials.py: where trials run: the TrialRunner protocol, and LocalTrials (one `orch run` each);
- cluster_trials.py: ClusterTrials (`orch sweep --cluster`: one job each, through orchestrator.api's Client),
  and store.py, what it reads and writes in a trial's prefix of the object store;
- tracking.py: the sweep's MLflow parent run (each trial's run its child);
- controller.py: the loop: ask, start, report, prune, tell, and after a restart take over what was cut off;
- status.py: `orch sweep status`: the rows, best first, and the plot (plot.py).
"""
