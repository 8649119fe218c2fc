"""The testbed's environment: the system tools (doctor), the Docker engine and images (engine, image), the
fresh-machine check (fresh) and a throwaway PostgreSQL cluster (postgres)."""
