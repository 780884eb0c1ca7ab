"""What a run produces: the terminal summary, JSON, HTML, JUnit and GitHub output, the zoo table."""
