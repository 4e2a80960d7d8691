"""PostgreSQL's names for the message type bytes of protocol 3 (its ``PqMsg_*`` in protocol.h), as ints.

Frontend and backend share some bytes (``C`` is Close from a frontend and CommandComplete from a backend);
the name says which direction it is read in.
"""

# Frontend (client to server)
BIND = 0x42  # B
CLOSE = 0x43  # C
DESCRIBE = 0x44  # D
EXECUTE = 0x45  # E
FUNCTION_CALL = 0x46  # F
FLUSH = 0x48  # H
PARSE = 0x50  # P
QUERY = 0x51  # Q
SYNC = 0x53  # S
TERMINATE = 0x58  # X
COPY_FAIL = 0x66  # f
PASSWORD_MESSAGE = 0x70  # p (also SASLInitialResponse, SASLResponse, GSSResponse)

# Both directions
COPY_DATA = 0x64  # d
COPY_DONE = 0x63  # c

# Backend (server to client)
PARSE_COMPLETE = 0x31  # 1
BIND_COMPLETE = 0x32  # 2
CLOSE_COMPLETE = 0x33  # 3
NOTIFICATION_RESPONSE = 0x41  # A
COMMAND_COMPLETE = 0x43  # C
DATA_ROW = 0x44  # D
ERROR_RESPONSE = 0x45  # E
COPY_IN_RESPONSE = 0x47  # G
COPY_OUT_RESPONSE = 0x48  # H
EMPTY_QUERY_RESPONSE = 0x49  # I
BACKEND_KEY_DATA = 0x4B  # K
NOTICE_RESPONSE = 0x4E  # N
AUTHENTICATION = 0x52  # R
PARAMETER_STATUS = 0x53  # S
ROW_DESCRIPTION = 0x54  # T
FUNCTION_CALL_RESPONSE = 0x56  # V
COPY_BOTH_RESPONSE = 0x57  # W
READY_FOR_QUERY = 0x5A  # Z
NO_DATA = 0x6E  # n
PORTAL_SUSPENDED = 0x73  # s
PARAMETER_DESCRIPTION = 0x74  # t
NEGOTIATE_PROTOCOL_VERSION = 0x76  # v
