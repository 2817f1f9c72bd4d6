"""What people see: the terminal tables and the live view, the HTML report and its plots, and
the exported configuration for their trainer. Built from the study's records alone."""
