"""The training loop and its services: step metrics and the NaN guard, preemption, replica checks,
goodput, profiling, the audit recorder, the eval loop. Imports the library; never a tool."""
