"""The server's Flower strategies.

- ``base``: :class:`SiteStrategy` (registration, answers keyed by site id, one evaluation at
  the end) and the local-only comparator's base; ``registry``: the table of sites.
- ``fused``: :class:`FusedSiteStrategy`, the fused methods' server; ``rounds``: its two
  algorithms, one object each (ADMM's rounds, pqn's rounds);
  ``grauc`` and ``rowfed``: each method's strategy and comparators; ``fedavg``: the
  FedAvg family on Flower's own classes.
- ``batch``: many fits side by side in one Flower run (a federated tuning), with
  ``workers``, the processes that solve the fits' model problems.
"""
