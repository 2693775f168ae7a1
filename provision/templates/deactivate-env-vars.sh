# shellcheck shell=sh
# Installed by bin/provision as $CONDA_PREFIX/etc/conda/deactivate.d/zz-lingbot-env-vars.sh.
#
# Undoes activate.d/zz-lingbot-env-vars.sh: every variable named in $CONDA_PREFIX/etc/lingbot/env-vars
# gets back its value from CONDA_BACKUP_LINGBOT_<NAME>, or is unset when it had none. conda runs
# deactivate.d scripts in reverse order, so this runs before the compiler packages' own scripts.

_lingbot_vars="${CONDA_PREFIX}/etc/lingbot/env-vars"
if [ -r "${_lingbot_vars}" ]; then
  # shellcheck disable=SC2034  # _lingbot_value: read must take the rest of the line somewhere
  while read -r _lingbot_mode _lingbot_name _lingbot_value; do
    case "${_lingbot_mode}" in set | default | prepend) ;; *) continue ;; esac
    case "${_lingbot_name}" in '' | [0-9]* | *[!A-Za-z0-9_]*) continue ;; esac
    _lingbot_isset=""
    eval "_lingbot_isset=\${CONDA_BACKUP_LINGBOT_${_lingbot_name}+x}"
    if [ "${_lingbot_isset}" = x ]; then
      eval "export ${_lingbot_name}=\"\${CONDA_BACKUP_LINGBOT_${_lingbot_name}}\""
      unset "CONDA_BACKUP_LINGBOT_${_lingbot_name}"
    else
      unset "${_lingbot_name}"
    fi
  done <"${_lingbot_vars}"
fi
unset _lingbot_vars _lingbot_mode _lingbot_name _lingbot_value _lingbot_isset
