"""Graph-building functions, one module per family; all re-exported here and in torchggml."""
from .views import *  # noqa: F401,F403
from .elementwise import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .norm import *  # noqa: F401,F403
from .matmul import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .rope import *  # noqa: F401,F403
from .rows import *  # noqa: F401,F403
from .custom import *  # noqa: F401,F403
