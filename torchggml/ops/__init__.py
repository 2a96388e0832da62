"""Graph-building functions, one module per family; all re-exported here and in torchggml."""
from . import (attention as _attention, custom as _custom, elementwise as _elementwise, matmul as _matmul,
               norm as _norm, reduce as _reduce, rope as _rope, rows as _rows, shape as _shape,
               training as _training, views as _views)
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
from .training import *  # noqa: F401,F403
from . import conv as _conv, image as _image, regions as _regions, deepseek as _deepseek
from .conv import *  # noqa: F401,F403
from .image import *  # noqa: F401,F403
from .regions import *  # noqa: F401,F403
from .deepseek import *  # noqa: F401,F403
from . import recurrent as _recurrent
from .recurrent import *  # noqa: F401,F403

__all__ = [name for family in (_views, _elementwise, _reduce, _shape, _norm, _matmul, _attention, _rope, _rows,
                               _custom, _training)
           for name in family.__all__]
__all__ += [name for family in (_conv, _image, _regions, _deepseek) for name in family.__all__]
__all__ += _recurrent.__all__
