/* Pinning: every map of a program lives under RLB_PIN_DIR (given by the agent with -D), so a
 * restarted agent or a newer program adopts the same state. */
#ifndef RLB_LIB_PIN_H
#define RLB_LIB_PIN_H

#define PIN(name) RLB_PIN_DIR "/" #name

#endif
