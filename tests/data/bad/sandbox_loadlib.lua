-- package.loadlib would load a C library
local x = input("x", {4, 8})
local f = package.loadlib("libc.so.6", "system") -- ERROR
minimize(x:sum())
