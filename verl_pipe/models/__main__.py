"""``python -m verl_pipe.models smollm2|tiny|PATH``: build (once) and print the model folder; used by `make install`."""

import sys

from verl_pipe.models import resolve_model_path

if __name__ == "__main__":
    for name in sys.argv[1:] or ["smollm2"]:
        try:
            print(resolve_model_path(name))
        except FileNotFoundError as error:
            print(f"verl-pipe: {error}", file=sys.stderr)
            sys.exit(2)
