"""The server's and the sites' mathematics, free of Flower (nothing here imports ``flwr``).

- ``admm``: the fused problem's splitting (incidence matrix, the graph pull, thresholds and
  duals of the paper's ADMM); ``penalties``: lasso, MCP and SCAD, their thresholds;
  ``problems``: each method's penalty side as an ADMM problem.
- ``pqn``: the proximal quasi-Newton server round; ``qnstate`` its state; ``curvature`` its
  curvature models; ``modelsolve`` the model problem's inner ADMM, with ``anderson``
  (acceleration), ``polish`` (the exact polish on a tree), ``fusedrows`` (RowFed's
  fused rows held compactly) and ``rowpolish`` (RowFed's exact solve on an identified
  pattern, certified).
- ``local``: a site's local step and curvature, written once against the datafit protocol.
- ``pairsum``: GrAUC-PFL's pair sums, in time linear in a site's rows.
- ``lockstep``: many fits' model problems of a round gathered into one call.
"""
