"""The Vagrant lab: the plan of VMs and links from a fabric file (plan), the in-VM setup that
installs the deployment (node), and the driver the opt-in VM test uses (driver)."""
