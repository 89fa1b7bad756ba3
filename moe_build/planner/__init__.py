"""The fusion planner: pure (spec, target, tokens) -> Plan."""
from .gates import PLAN_SCHEMA_VERSION, Gate, Plan, StageDecision
from .plan import OOTB_STAGES, PLUGIN_STAGES, STAGE_CHOICES, STEP_STAGES, make_plan, parse_force

__all__ = ["PLAN_SCHEMA_VERSION", "Gate", "Plan", "StageDecision", "OOTB_STAGES", "PLUGIN_STAGES",
           "STAGE_CHOICES", "STEP_STAGES", "make_plan", "parse_force"]
