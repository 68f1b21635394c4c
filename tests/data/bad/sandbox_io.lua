-- io: no file access
local x = input("x", {4, 8})
local f = io.open("/etc/passwd") -- ERROR
minimize(x:sum())
