"""Fabric policy, all of it: per-prefix route compilation with FARE arithmetic (compiler,
pathbw) and QP placement (placement, qpplacer, the hosts' local rule)."""
