"""The job file: what job.yaml may say, and how a file becomes a validated spec.

- `fields.py`: the field types and rules every model uses (Kubernetes names and quantities, paths,
  durations, bounded integers, the JSON-values rule) and the `Model` base; new fields take their type
  from here, new rules go here.
- `spec.py`: `JobSpec` and its parts (pods, scheduling, restarts, output, metrics, tracking) and the
  cross-field rules every API shares. Its `train:` section is the trainer's own config,
  `orchestrator.trainer.config.TrainSpec`, kept beside the trainer.
- `loading.py`: file + `--set` -> a validated JobSpec, or one `FILE:LINE:COL: field: why` error.
- `yaml_positions.py` (where each value of a YAML file stands), `durations.py` (the one duration parser,
  shared with the CLI's flags).

Imports nothing: the trainer reads `fields` without building the job spec's models, the CLI's option types
read `durations` without pydantic.
"""
