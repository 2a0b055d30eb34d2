"""Test doubles that are real where it matters: an HTTP Kubernetes API emulator driven by the official client
(`emulator`), the test's handle on it that plays the controllers (`kube`), and a user's kubeconfig and CLI
(`cli`). A library, imported by test modules; fixtures stay in the conftest files."""
