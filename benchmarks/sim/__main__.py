from gpuslice_hub.loopwatch import tune_garbage_collection

from .cli import main

# the service's own garbage-collection settings (its start makes them: loopwatch.py), for
# the program only: tests call main() in their own process
tune_garbage_collection()
main()
