"""Rendering: a validated JobSpec -> the Kubernetes objects that run it, as plain dicts (no I/O).

`render.render` is the entry (the objects in apply order; `check`, `warnings`, `to_yaml`): it builds the
typed `parts` once, and the job API modules (orchestrator/apis/) write their objects from them with the
pieces here: `pod` (the one pod template every API runs), `templates` (the Jinja2 templates of manifests/,
strict and YAML-safe), `scheduling` (queue and gang facts), `tracking_record` (the tracking annotation:
its writer and its reader). `pod_shape` is the shape
of a pod spec, which the job spec checks `pod_overrides` against before anything is rendered.

Imports nothing: the job spec (pod_shape) and `orch status` (tracking_record) import one module here
without the rest.
"""
