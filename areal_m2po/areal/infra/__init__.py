"""AReaL's ``areal.infra`` names a workflow uses (areal-project/AReaL cbff54d6):
``workflow_context``. AReaL's controllers, schedulers and services are out of scope."""
