"""The process a run lives in: distributed init, CPU devices, quieting, exits, the compilation cache."""
