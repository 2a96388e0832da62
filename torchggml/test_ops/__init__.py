"""`torchggml test-ops`: test-backend-ops' case table (cases/), its runner (runner.py), the
command (command.py) and the meta device's checks (meta.py)."""
