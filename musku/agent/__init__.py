"""The musku agent: runs on every host under test (``musku agent run``).

- :mod:`musku.agent.core`: the state machine (knobs, journal, lease, spool, requests);
- :mod:`musku.agent.journal`, :mod:`musku.agent.spool`: crash-safe SQLite state;
- :mod:`musku.agent.server`, :mod:`musku.agent.protocol`, :mod:`musku.agent.client`: the API;
- :mod:`musku.agent.daemon`: the main loop; :mod:`musku.agent.cli`: the commands.
"""
