"""How a run is started and driven: the in-process engine on Flower's own ``Server``
(:mod:`.engine`), the ``flwr run`` simulation launcher (:mod:`.simulation`), the deployment
helpers (:mod:`.deploy`), the command-line plumbing both methods' commands share
(:mod:`.cli`), the one ``fit`` flow of both methods (:mod:`.fitflow`), and independent
pieces of work in a pool of processes (:mod:`.pieces`)."""
