# Makes this folder the package `orchestrator.manifests` (see pyproject.toml), so importlib.resources finds
# the templates the same way in a checkout, an editable install and a wheel.
