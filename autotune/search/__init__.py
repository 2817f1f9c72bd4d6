"""The tuner's side: the study's search (`tuner`, `worker`, `confirm`), what it decides without
a trial (`space`, `shortcuts`, `memory_model`, `loader_plan`, `budget`), how a result is
recorded (`outcome`, `heartbeat`), and the parent's side of the process boundary (`runner`,
`isolation`, `forkserver`). It never imports the model file, and it talks to whoever watches
through `events.StudyView`."""
