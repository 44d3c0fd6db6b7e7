"""μqSim-style queueing-network simulation of microservice graphs (docs/qsim.md).

``model`` reads and validates model files, ``engine`` runs them through the C++ engine
(services/qsim), ``uqsim`` imports μqSim's architecture directories, ``cli`` is ``musku qsim``.
"""
