"""How a run is started and driven: the in-process engine on Flower's own ``Server``
(:mod:`.engine`), the ``flwr run`` simulation launcher (:mod:`.simulation`), the deployment
helpers (:mod:`.deploy`) and the command-line plumbing both methods' commands share
(:mod:`.cli`), and independent pieces of work in a pool of processes (:mod:`.pieces`)."""
