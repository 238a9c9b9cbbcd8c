"""Never loaded by `lazypkg` itself: a function that reads
`lazypkg.eager` without importing it fails, in the sandbox as here."""

VALUE = 2
