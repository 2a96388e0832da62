"""python -m torchggml (and torchrun -m torchggml): the torchggml command."""
import sys

from .cli import main

sys.exit(main())
