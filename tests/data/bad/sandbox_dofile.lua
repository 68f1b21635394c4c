-- dofile reads any file (and echoed its first tokens in messages)
local x = input("x", {4, 8})
dofile("/etc/passwd") -- ERROR
minimize(x:sum())
