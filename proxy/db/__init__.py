"""The seat's own schema (``openwop_seat``) in the host database: layout steps, artifact objects, checks.

Layout versioning follows the seed on evolving stores:

* ``meta.layout_version`` records the layout the schema was migrated to.  The
  layout is changed only by the ordered :data:`STEPS`; a published step never
  changes (a later change is a new step), and each step runs in its own
  transaction under a session advisory lock, so replicas starting together
  migrate once.
* A layout newer than this code is refused (:class:`SchemaTooNew`); a layout the
  code has no step path from is refused (:class:`SchemaGap`) instead of guessed.

Separately from the layout, every ``migrate`` (re)installs the *artifact
objects*: SQL functions generated from the pinned spec artifacts (the v1 type
list, the registered vendor orgs, the bijection verdict) and from the
configured era store, in one transaction together with recording the artifact
digest and tag in ``meta``.  A proxy whose artifact digest differs from the
recorded one refuses to serve (:class:`DigestMismatch`), so every replica reads
one log one way.  The operator's declarations of the host's own payload names
(``[host] declarations_file``, ADR 0010) are installed the same way, as
``declared_v2`` (:mod:`proxy.db.declarations_sql`), with their digest in
``meta.declarations_digest``; a seat or tool configured with other declarations
refuses the database too (:class:`DeclarationsMismatch`).

The era of a run is read by the database itself, in the statement's own
snapshot: the read path appends :func:`read_check_sql` over :func:`era_sql` to
each translated statement.  ``read_v2``/``read_v1`` are single-expression SQL
functions that PostgreSQL inlines into the statement; a row the reader rule
cannot read makes ``refuse_row`` raise, which fails the statement (and aborts
an explicit transaction) exactly as any PostgreSQL error does, with the
dedicated SQLSTATE of :mod:`proxy.errors` and the OpenWOP error envelope as
JSON in DETAIL.

Era stores.  By default the era lives in ``openwop_seat.run_era``: a row only
for runs stamped 3, absent means 2, never an explicit 2 (the table's CHECK
enforces it).  With ``[host] era_column`` the era lives in a nullable integer
column of the host's runs table instead, with the same meaning: NULL, or no
runs row at all, means 2 (as an absent ``run_era`` row does), 3 means 3, and
any other value (including an explicit 2) is refused as ``event_row_malformed``
rather than guessed at: the seat only ever writes 3 there, so another value
means something else wrote the column, and the two stores must read alike.
``migrate`` suggests ``smallint CHECK (col = 3)`` for the column, which makes
such values impossible.

The writer rule lives in the database too (design §4), installed by ``migrate``:

* Who is writing.  Right after authentication the seat asks the session for
  a challenge (``openwop_seat.claim_challenge()``) and answers it with
  ``openwop_seat.claim(proof, major)``, the proof an HMAC under the salted
  SHA-256 of the secret that ``migrate`` stored in ``claim_secret`` (no other
  role can read it); the secret never reaches the session (ADR 0006).  The
  major is recorded in ``claims`` keyed by backend pid *and* backend start
  time, so a later backend that reuses the pid inherits nothing.
  ``session_major()`` is that record for the current backend, or NULL.  A
  session setting cannot stand in for it (any client can ``SET`` one), and no
  statement parsing can (dynamic SQL defeats it).  A session without a claim
  (one that bypasses the seat) is a v1 writer: the safe side.  The guard is
  as strong as the roles: the host must connect neither as a superuser nor as
  the owner of ``openwop_seat``.
* Stamping.  A run inserted by a major-2 session is stamped era 3 in the same
  transaction by a row trigger on the runs table, whatever SQL inserted it.
* Appends.  A row trigger on the events table applies the writer rule by the
  run's era and the session's major: a major-2 append to an era-2 run is stored
  in its v1 spelling (inverse codemap) or refused (``event_type_unmapped``), a
  major-2 append to an era-3 run must be in v2 vocabulary, and an append by any
  other session to an era-3 run is refused (``era2_write_refused``).  An
  UPDATE of an event's type or run is refused except for
  ``[host] maintenance_role``.
* Atomicity across replicas.  Every append takes a shared transaction-level
  advisory lock on ``run_lock_key(run)`` before it reads the run's era; every
  stamp (``stamp_run``, which the creation trigger and a backfill use) takes
  the same key exclusively before it writes.  A stamp therefore waits for the
  appends in flight to its run, and an append waits for a stamp in flight and
  then reads the era again in a fresh READ COMMITTED snapshot.  Under
  REPEATABLE READ or SERIALIZABLE the append reads the era in its transaction
  snapshot, so a stamp that commits after that snapshot was taken is detected
  instead and the append fails with ``serialization_failure`` (40001), to be
  retried as any such failure: a stamp still in flight is seen as a held lock,
  and one already committed, with the ``run_era`` store, by a probe of
  ``run_era``'s primary key (a uniqueness check sees rows no snapshot shows).
  With ``[host] era_column`` that second case is not detected (see
  :func:`writer_rule_sql`).
"""
