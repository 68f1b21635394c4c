-- load() asked for binary mode: text chunks only
local x = input("x", {4, 8})
local f = load("return 1", "chunk", "b") -- ERROR
minimize(x:sum())
