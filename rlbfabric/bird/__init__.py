"""bird2 for the fabric: configs rendered from the fabric file (conf) and the control-socket
client and reply parser (ctl)."""
